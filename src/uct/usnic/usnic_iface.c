/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_iface.h"
#include "usnic_bundle.h"
#include "usnic_ep.h"
#include "usnic_get.h"
#include "usnic_netif.h"
#include "usnic_rx.h"
#include "usnic_tx.h"

#include <ucs/debug/log.h>
#include <ucs/sys/sock.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>
#include <ucs/sys/uid.h>

#include <rdma/fi_errno.h>
#include <rdma/fi_endpoint.h>
#include <arpa/inet.h>
#include <sys/timerfd.h>


/* Ethernet preamble, header, FCS and gap, plus IPv4 and UDP headers */
#define UCT_USNIC_WIRE_OVERHEAD      (38 + 20 + 8)

/* How long our last ep to a peer must have been gone before its probes are
 * answered as closed */
#define UCT_USNIC_PEER_CLOSE_GRACE_MS 100

/* CWND_INIT=auto, in datagrams: with a receive queue of RX_QUEUE_LEN (1024
 * by default), and with a kernel's default socket buffer (about 200 KiB) */
#define UCT_USNIC_CWND_INIT_OWN_RXQ   256
#define UCT_USNIC_CWND_INIT_DEFAULT   64


/*
 * What one datagram costs with a provider, for iface_query. udp: a system
 * call on each side, measured with contrib/bench.sh (one-way latency of 8
 * bytes, sender CPU per message); usnic: OS bypass on a VIC.
 */
static const struct {
    const char *provider;
    double     latency;  /* One way, seconds */
    double     overhead; /* Sender CPU per datagram, seconds */
} uct_usnic_provider_costs[] = {
    {UCT_USNIC_PROVIDER_USNIC,  2e-6, 0.3e-6},
    {UCT_USNIC_PROVIDER_KERNEL, 6e-6, 1e-6},
    {"udp",                     7e-6, 2.5e-6} /* also for any other */
};


#ifdef ENABLE_STATS
static ucs_stats_class_t uct_usnic_iface_stats_class = {
    .name          = "usnic_iface",
    .num_counters  = UCT_USNIC_IFACE_STAT_LAST,
    .class_id      = UCS_STATS_CLASS_ID_INVALID,
    .counter_names = {
        [UCT_USNIC_IFACE_STAT_TX_PACKETS]           = "tx_packets",
        [UCT_USNIC_IFACE_STAT_TX_RESENDS]           = "tx_resends",
        [UCT_USNIC_IFACE_STAT_TX_TIMEOUTS]          = "tx_timeouts",
        [UCT_USNIC_IFACE_STAT_TX_TAIL_PROBES]       = "tx_tail_probes",
        [UCT_USNIC_IFACE_STAT_TX_READS_REVOKED]     = "tx_reads_revoked",
        [UCT_USNIC_IFACE_STAT_TX_ACKS]              = "tx_acks",
        [UCT_USNIC_IFACE_STAT_TX_ACK_DGRAMS]        = "tx_ack_datagrams",
        [UCT_USNIC_IFACE_STAT_TX_PIGGY_ACKS]        = "tx_piggy_acks",
        [UCT_USNIC_IFACE_STAT_TX_BUNDLED]           = "tx_bundled",
        [UCT_USNIC_IFACE_STAT_TX_HELD]              = "tx_held",
        [UCT_USNIC_IFACE_STAT_TX_REOPENS]           = "tx_reopens",
        [UCT_USNIC_IFACE_STAT_RX_PACKETS]           = "rx_packets",
        [UCT_USNIC_IFACE_STAT_RX_ACKS]              = "rx_acks",
        [UCT_USNIC_IFACE_STAT_RX_STREAMS_RECLAIMED] = "rx_streams_reclaimed",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_INVALID]                 = "rx_drop_invalid",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_STALE]                   = "rx_drop_stale",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_FORGED]                  = "rx_drop_forged",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_NO_STREAM]               = "rx_drop_no_stream",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_DUPLICATE]               = "rx_drop_duplicate",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_OUT_OF_WINDOW]           = "rx_drop_out_of_window",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_NO_RESOURCE]             = "rx_drop_no_resource",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_PUT_KEY]                 = "rx_drop_put_key",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_PUT_RANGE]               = "rx_drop_put_range",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_GET_KEY]                 = "rx_drop_get_key",
        [UCT_USNIC_IFACE_STAT_RX_DROP +
         UCT_USNIC_RX_DROP_GET_RANGE]               = "rx_drop_get_range"
    }
};
#endif


static const char *uct_usnic_channel_names[] = {
    [UCT_USNIC_CHANNEL_PRIO] = "prio",
    [UCT_USNIC_CHANNEL_DATA] = "data",
    [UCT_USNIC_CHANNEL_LAST] = NULL
};


#define UCT_USNIC_FAULT_CONFIG_FIELD(_type, _what) \
    {"FAULT_" #_type, "0", \
     "Fault injection, for testing: probability (0..1) that a datagram is\n" \
     _what ".", \
     ucs_offsetof(uct_usnic_iface_config_t, \
                  fault.prob[UCT_USNIC_FAULT_##_type]), \
     UCS_CONFIG_TYPE_DOUBLE}


static ucs_config_field_t uct_usnic_iface_config_table[] = {
    {"", "", NULL,
     ucs_offsetof(uct_usnic_iface_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},

    {"MTU", "auto",
     "Largest datagram sent, protocol headers included. \"auto\" uses the\n"
     "largest message the libfabric provider accepts.",
     ucs_offsetof(uct_usnic_iface_config_t, mtu), UCS_CONFIG_TYPE_MEMUNITS},

    {"TX_QUEUE_LEN", "256",
     "Number of datagrams that may be in flight in the send queue of each\n"
     "channel.",
     ucs_offsetof(uct_usnic_iface_config_t, tx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"RX_QUEUE_LEN", "1024",
     "Number of receive buffers kept posted on the data channel.",
     ucs_offsetof(uct_usnic_iface_config_t, rx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"PRIO_RX_QUEUE_LEN", "128",
     "Number of receive buffers kept posted on the priority channel, which\n"
     "carries acknowledgements and control messages.",
     ucs_offsetof(uct_usnic_iface_config_t, prio_rx_queue_len),
     UCS_CONFIG_TYPE_UINT},

    {"RX_POST_BATCH", "32",
     "Receive buffers are reposted in batches of this many.",
     ucs_offsetof(uct_usnic_iface_config_t, rx_post_batch),
     UCS_CONFIG_TYPE_UINT},

    {"MAX_POLL", "1024",
     "Maximal number of datagrams taken from each channel per progress call.\n"
     "A target that progresses now and then (a passive RMA target) takes\n"
     "what arrived meanwhile in one call: as many as WINDOW lets one sender\n"
     "send without an ACK.",
     ucs_offsetof(uct_usnic_iface_config_t, max_poll), UCS_CONFIG_TYPE_UINT},

    {"WINDOW", "1024",
     "Datagrams an endpoint may have in flight without acknowledgement; also\n"
     "the number of out-of-order datagrams a receiver keeps per stream. A\n"
     "power of two, so that the receiver's reorder ring stays consistent\n"
     "where sequence numbers wrap around.",
     ucs_offsetof(uct_usnic_iface_config_t, window), UCS_CONFIG_TYPE_UINT},

    {"CWND_INIT", "auto",
     "Congestion window of a new endpoint, in datagrams (at most WINDOW, at\n"
     "least one largest message). A loss reported by a selective ACK never\n"
     "shrinks the window below it: later datagrams arrived, so the loss is as\n"
     "likely random as congestion. auto: 256 where the receive queue holds\n"
     "RX_QUEUE_LEN datagrams (the kernel and usnic providers), 64 on other\n"
     "libfabric providers (udp keeps the kernel's default socket buffer,\n"
     "which a 256-datagram burst overflows). Lower it where many senders\n"
     "share a congested link; raise it where one round trip carries more.",
     ucs_offsetof(uct_usnic_iface_config_t, cwnd_init),
     UCS_CONFIG_TYPE_ULUNITS},

    {"MAX_BCOPY", "60k",
     "Largest am_bcopy message; larger than a datagram, it is cut into\n"
     "datagrams and reassembled in order by the receiver, which refuses\n"
     "messages larger than its own limit (set the same on both sides). The\n"
     "default keeps a message within the 64 KiB that one segmentation-offload\n"
     "send of the kernel provider carries, at MTUs of 1500 and 9000.",
     ucs_offsetof(uct_usnic_iface_config_t, max_bcopy),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"PUT_MAX_BCOPY", "60k",
     "Largest put_bcopy; larger than a datagram, it is cut into datagrams\n"
     "that the target applies in order (one system call for all of them\n"
     "with the kernel provider, as for MAX_BCOPY).",
     ucs_offsetof(uct_usnic_iface_config_t, put_max_bcopy),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"GET_MAX_ZCOPY", "1m",
     "Largest get_zcopy. The target sends the data as its window to this\n"
     "iface opens, so a read may be larger than the window; every read costs\n"
     "the requester a datagram, and a larger one fewer of them (get_bcopy\n"
     "reads at most MAX_BCOPY and PUT_MAX_BCOPY).",
     ucs_offsetof(uct_usnic_iface_config_t, get_max_zcopy),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"ACK_FREQ", "16",
     "A receiver acknowledges at least every this many datagrams.",
     ucs_offsetof(uct_usnic_iface_config_t, ack_freq), UCS_CONFIG_TYPE_UINT},

    {"ACK_DELAY", "50us",
     "Longest time a receiver holds back an acknowledgement to batch it, and\n"
     "longest time a streaming sender leaves its empty data channel unpolled.",
     ucs_offsetof(uct_usnic_iface_config_t, ack_delay), UCS_CONFIG_TYPE_TIME},

    {"BUNDLE_DELAY", "10us",
     "Longest time a short active message waits to share a datagram with\n"
     "the next ones to the same peer. Only a message posted while the\n"
     "endpoint's previous datagrams are unacknowledged and the last was sent\n"
     "less than this long ago waits; the bundle goes when it is full, when\n"
     "everything before it is acknowledged, when another operation or a\n"
     "flush follows, or after this delay. With the kernel provider, larger\n"
     "messages posted less than this long after the previous post on the\n"
     "endpoint likewise wait, at most this long, to leave with the next\n"
     "ones in one system call. 0 sends every message at once. Bundles are\n"
     "off when the iface is opened with an AM alignment.",
     ucs_offsetof(uct_usnic_iface_config_t, bundle_delay),
     UCS_CONFIG_TYPE_TIME},

    {"RTO_MIN", "1ms",
     "Smallest retransmission timeout; the timeout follows the measured\n"
     "round-trip time above it.",
     ucs_offsetof(uct_usnic_iface_config_t, rto_min), UCS_CONFIG_TYPE_TIME},

    {"RTO_MAX", "500ms",
     "Largest retransmission timeout, reached by doubling after each\n"
     "timeout.",
     ucs_offsetof(uct_usnic_iface_config_t, rto_max), UCS_CONFIG_TYPE_TIME},

    {"ASYNC_TICK", "10ms",
     "Period of a timer on the async thread that sends the ACKs an iface\n"
     "owes while nobody progresses it (a peer waiting in flush depends on\n"
     "them). Shorter ticks shorten that wait but steal CPU from busy cores.",
     ucs_offsetof(uct_usnic_iface_config_t, async_tick), UCS_CONFIG_TYPE_TIME},

    {"MAX_RESEND", "32",
     "Most datagrams resent in one progress call, so that recovery never\n"
     "starves new traffic.",
     ucs_offsetof(uct_usnic_iface_config_t, max_resend),
     UCS_CONFIG_TYPE_UINT},

    {"TIMEOUT", "10s",
     "An endpoint whose peer acknowledges nothing for this long fails with\n"
     "UCS_ERR_ENDPOINT_TIMEOUT through the iface's error handler.",
     ucs_offsetof(uct_usnic_iface_config_t, timeout), UCS_CONFIG_TYPE_TIME},

    {"MAX_STREAMS", "4096",
     "Most receive streams (one per remote endpoint sending to this iface).\n"
     "A new stream beyond it takes the place of the one quiet the longest,\n"
     "if quiet for STREAM_IDLE; else its packets are dropped until one is.\n"
     "A stream whose sender has been silent for TIMEOUT is reclaimed anyway;\n"
     "a sender whose stream was reclaimed opens it again.",
     ucs_offsetof(uct_usnic_iface_config_t, max_streams), UCS_CONFIG_TYPE_UINT},

    {"STREAM_IDLE", "1s",
     "How long a stream must have been quiet to give way to a new one when\n"
     "MAX_STREAMS are open; at least twice RTO_MAX (a smaller value counts as\n"
     "that), so that its sender is known to have every acknowledgement.",
     ucs_offsetof(uct_usnic_iface_config_t, stream_idle), UCS_CONFIG_TYPE_TIME},

    {"MAX_OOO", "1024",
     "Most packets kept out of order, waiting for the ones before them, on\n"
     "all streams of the iface together. Beyond it, such packets are dropped\n"
     "and resent by their senders. Each stream with packets kept also holds\n"
     "a reorder ring of STREAM_MAX_OOO pointers.",
     ucs_offsetof(uct_usnic_iface_config_t, max_ooo), UCS_CONFIG_TYPE_UINT},

    {"STREAM_MAX_OOO", "1024",
     "How far ahead of the next expected packet a stream keeps packets that\n"
     "arrive out of order; rounded up to a power of two, and at most WINDOW\n"
     "(a larger value counts as WINDOW).",
     ucs_offsetof(uct_usnic_iface_config_t, stream_max_ooo),
     UCS_CONFIG_TYPE_UINT},

    {"MAX_REASSEMBLY", "64",
     "Most messages of several datagrams being reassembled at once, on all\n"
     "streams together; each holds a buffer of MAX_BCOPY bytes. The first\n"
     "datagram of one more is dropped and resent by its sender.",
     ucs_offsetof(uct_usnic_iface_config_t, max_reassembly),
     UCS_CONFIG_TYPE_UINT},

    {"PORT_RANGE", "0",
     "UDP ports the channels bind to, tried in order, a free one for each\n"
     "channel (priority channel first); 0 lets the operating system choose.\n"
     "A fixed range is what a firewall can open, and brings a restarted\n"
     "process back on the ports its peers knew. Every iface on the host needs\n"
     "two ports of the range.",
     ucs_offsetof(uct_usnic_iface_config_t, port_range),
     UCS_CONFIG_TYPE_RANGE_SPEC},

    {"CONNECTED_PEERS", "64",
     "kernel provider: how many peer addresses (a peer iface has two, one per\n"
     "channel) get a send socket of their own, connected to the address: the\n"
     "kernel then keeps the route where it looks it up for every datagram\n"
     "sent to an address (about 3% of a ping-pong's latency). Each costs a\n"
     "file descriptor; the first addresses in use get them. With 0, and with\n"
     "a PORT_RANGE, every datagram leaves from the ports of the channels.",
     ucs_offsetof(uct_usnic_iface_config_t, connected_peers),
     UCS_CONFIG_TYPE_UINT},

    {"EVENT_FD", "n",
     "Let the user wait for events on a file descriptor (uct_iface_event_fd_get,\n"
     "UCP's wakeup feature). The completion queues then get wait objects,\n"
     "which costs a system call per received datagram.",
     ucs_offsetof(uct_usnic_iface_config_t, event_fd), UCS_CONFIG_TYPE_BOOL},

    {"STATS_SUMMARY", "n",
     "Print one line of the iface's counters when it closes: datagrams sent\n"
     "and received, resends by cause, ACKs, drops by reason. Without it the\n"
     "line goes to the debug log.",
     ucs_offsetof(uct_usnic_iface_config_t, stats_summary),
     UCS_CONFIG_TYPE_BOOL},

    {"FORCE_MSG_PREFIX", "0",
     "Test switch: reserve a message prefix of this many bytes in front of\n"
     "every datagram buffer, as the usnic provider demands (FI_MSG_PREFIX),\n"
     "on a libfabric provider that does not ask for one. The prefix is\n"
     "filled with a pattern on every send and checked on every receive.",
     ucs_offsetof(uct_usnic_iface_config_t, force_msg_prefix),
     UCS_CONFIG_TYPE_MEMUNITS},

    {"CHECKSUM", "y",
     "End-to-end checksum (32 bits of XXH3) on every datagram: a datagram that\n"
     "is not byte for byte what the peer sent (damaged where the link's own\n"
     "checksums miss it, or altered on the way by someone who did not\n"
     "recompute this one) is dropped and counted. Costs 4 bytes and a pass\n"
     "over each datagram; both sides must set the same value.",
     ucs_offsetof(uct_usnic_iface_config_t, checksum), UCS_CONFIG_TYPE_BOOL},

    {"AUTH_KEY", "",
     "File holding a secret shared by every process of the job: 16 to 4096\n"
     "bytes, e.g. made with 'head -c 32 /dev/urandom > FILE', readable only by\n"
     "its owner. When set, every datagram carries a 16-byte MAC (keyed BLAKE2b,\n"
     "libsodium) in place of the checksum: a datagram not sent by a holder of\n"
     "the key, or altered on the way, is dropped and counted, whoever sent it.\n"
     "All processes must set the same key. Needs libsodium at build time.",
     ucs_offsetof(uct_usnic_iface_config_t, auth_key), UCS_CONFIG_TYPE_STRING},

    UCT_USNIC_FAULT_CONFIG_FIELD(DROP, "never sent"),
    UCT_USNIC_FAULT_CONFIG_FIELD(DUPLICATE, "sent twice"),
    UCT_USNIC_FAULT_CONFIG_FIELD(REORDER, "sent after the next datagram"),
    UCT_USNIC_FAULT_CONFIG_FIELD(DELAY, "held for UCX_USNIC_FAULT_DELAY_TIME"),
    UCT_USNIC_FAULT_CONFIG_FIELD(CORRUPT, "sent with one byte changed"),
    UCT_USNIC_FAULT_CONFIG_FIELD(TRUNCATE, "sent cut short"),

    {"FAULT_DELAY_TIME", "1ms",
     "Fault injection: how long a delayed datagram is held; also the longest\n"
     "a reordered one waits for a datagram to overtake it.",
     ucs_offsetof(uct_usnic_iface_config_t, fault.delay_time),
     UCS_CONFIG_TYPE_TIME},

    {"FAULT_SEED", "1",
     "Fault injection: seed of the random choices; the same seed and traffic\n"
     "give the same faults.",
     ucs_offsetof(uct_usnic_iface_config_t, fault.seed), UCS_CONFIG_TYPE_ULONG},

    {"FAULT_CHANNELS", "prio,data",
     "Fault injection: channels whose outgoing datagrams it affects.",
     ucs_offsetof(uct_usnic_iface_config_t, fault.channels),
     UCS_CONFIG_TYPE_BITMAP(uct_usnic_channel_names)},

    UCT_USNIC_IFACE_MPOOL_CONFIG_FIELDS("RX_", -1, 0, "receive",
                                        ucs_offsetof(uct_usnic_iface_config_t,
                                                     rx_mpool),
                                        ""),

    UCT_USNIC_IFACE_MPOOL_CONFIG_FIELDS("TX_", -1, 256, "send",
                                        ucs_offsetof(uct_usnic_iface_config_t,
                                                     tx_mpool),
                                        "\nA send buffer holds a datagram "
                                        "until it is acknowledged."),

    {NULL}
};


/* One range a configuration value must lie in */
typedef struct {
    const char    *var;
    unsigned long value;
    unsigned long min;
    unsigned long max;
    const char    *why;
} uct_usnic_config_range_t;


/* Check the configuration against what the provider can do */
static ucs_status_t
uct_usnic_iface_check_config(const uct_usnic_iface_config_t *config,
                             const struct fi_info *info)
{
    size_t rx_size                          = info->rx_attr->size;
    const uct_usnic_config_range_t ranges[] = {
        {UCT_USNIC_CONFIG_VAR("MTU"),
         (config->mtu == UCS_MEMUNITS_AUTO) ? 64 : config->mtu, 64,
         uct_usnic_channel_max_dgram(info), "the provider's largest datagram"},
        {UCT_USNIC_CONFIG_VAR("FORCE_MSG_PREFIX"), config->force_msg_prefix,
         0, UCT_USNIC_MAX_FORCED_PREFIX, "bytes of prefix room"},
        {UCT_USNIC_CONFIG_VAR("RX_POST_BATCH"), config->rx_post_batch, 1,
         1024, "receives posted at once"},
        {UCT_USNIC_CONFIG_VAR("RX_QUEUE_LEN"), config->rx_queue_len,
         config->rx_post_batch, rx_size,
         "at least RX_POST_BATCH, at most the provider's receive queue"},
        {UCT_USNIC_CONFIG_VAR("PRIO_RX_QUEUE_LEN"), config->prio_rx_queue_len,
         config->rx_post_batch, rx_size,
         "at least RX_POST_BATCH, at most the provider's receive queue"},
        {UCT_USNIC_CONFIG_VAR("TX_QUEUE_LEN"), config->tx_queue_len, 1,
         info->tx_attr->size, "the provider's send queue"},
        {UCT_USNIC_CONFIG_VAR("MAX_POLL"), config->max_poll, 1, 65536,
         "completions per progress call"},
        {UCT_USNIC_CONFIG_VAR("WINDOW"), config->window, 16, 32768,
         "datagrams in flight per endpoint"},
        {UCT_USNIC_CONFIG_VAR("CWND_INIT"),
         (config->cwnd_init == UCS_ULUNITS_AUTO) ? 1 : config->cwnd_init, 1,
         config->window, "at most WINDOW"},
        {UCT_USNIC_CONFIG_VAR("MAX_BCOPY"), config->max_bcopy, 64,
         1024 * 1024, "bytes of one am_bcopy message"},
        {UCT_USNIC_CONFIG_VAR("PUT_MAX_BCOPY"), config->put_max_bcopy, 64,
         1024 * 1024, "bytes of one put_bcopy"},
        {UCT_USNIC_CONFIG_VAR("GET_MAX_ZCOPY"), config->get_max_zcopy, 1,
         UINT32_MAX, "bytes of one get_zcopy"},
        {UCT_USNIC_CONFIG_VAR("ACK_FREQ"), config->ack_freq, 1,
         config->window, "at most WINDOW"},
        {UCT_USNIC_CONFIG_VAR("MAX_RESEND"), config->max_resend, 1, 65536,
         "datagrams per progress call"},
        {UCT_USNIC_CONFIG_VAR("MAX_STREAMS"), config->max_streams, 1,
         UCT_USNIC_STREAM_ID_NONE - 1, "receive streams per iface"},
        {UCT_USNIC_CONFIG_VAR("MAX_OOO"), config->max_ooo, 0, 1 << 20,
         "packets kept out of order per iface"},
        {UCT_USNIC_CONFIG_VAR("STREAM_MAX_OOO"), config->stream_max_ooo, 1,
         32768, "packets ahead of a stream's next"},
        {UCT_USNIC_CONFIG_VAR("MAX_REASSEMBLY"), config->max_reassembly, 1,
         1 << 20, "messages reassembled at once per iface"},
        {UCT_USNIC_CONFIG_VAR("CONNECTED_PEERS"), config->connected_peers, 0,
         65536, "sockets connected to peer addresses per iface"}
    };
    const uct_usnic_config_range_t *range;
    int type;

    if ((config->force_msg_prefix != 0) &&
        !strcmp(info->fabric_attr->prov_name, UCT_USNIC_PROVIDER_KERNEL)) {
        ucs_error("%s=%zu: a test switch for libfabric providers; the %s "
                  "provider takes no message prefix",
                  UCT_USNIC_CONFIG_VAR("FORCE_MSG_PREFIX"),
                  config->force_msg_prefix, UCT_USNIC_PROVIDER_KERNEL);
        return UCS_ERR_INVALID_PARAM;
    }

    if (!ucs_is_pow2(config->window)) {
        ucs_error("%s=%u must be a power of two",
                  UCT_USNIC_CONFIG_VAR("WINDOW"), config->window);
        return UCS_ERR_INVALID_PARAM;
    }

    for (range = ranges; range < ranges + ucs_static_array_size(ranges);
         ++range) {
        if ((range->value < range->min) || (range->value > range->max)) {
            ucs_error("%s=%lu is out of range: must be between %lu and %lu "
                      "(%s)", range->var, range->value, range->min,
                      range->max, range->why);
            return UCS_ERR_INVALID_PARAM;
        }
    }

    for (type = 0; type < UCT_USNIC_FAULT_LAST; ++type) {
        if (!(config->fault.prob[type] >= 0) ||
            (config->fault.prob[type] > 1)) {
            ucs_error("%sFAULT_%s=%g is out of range: must be a probability "
                      "between 0 and 1", UCT_USNIC_CONFIG_VAR(""),
                      uct_usnic_fault_names[type], config->fault.prob[type]);
            return UCS_ERR_INVALID_PARAM;
        }
    }

    if (!config->checksum && (config->auth_key[0] == '\0') &&
        ((config->fault.prob[UCT_USNIC_FAULT_CORRUPT] > 0) ||
         (config->fault.prob[UCT_USNIC_FAULT_TRUNCATE] > 0))) {
        ucs_warn("%s and %s without %s=y: damaged datagrams may be "
                 "delivered", UCT_USNIC_CONFIG_VAR("FAULT_CORRUPT"),
                 UCT_USNIC_CONFIG_VAR("FAULT_TRUNCATE"),
                 UCT_USNIC_CONFIG_VAR("CHECKSUM"));
    }

    if ((config->timeout <= 0) ||
        (config->timeout < config->rto_max)) {
        ucs_error("%s=%g must be at least %s=%g (seconds)",
                  UCT_USNIC_CONFIG_VAR("TIMEOUT"), config->timeout,
                  UCT_USNIC_CONFIG_VAR("RTO_MAX"), config->rto_max);
        return UCS_ERR_INVALID_PARAM;
    }

    if ((config->port_range.first > config->port_range.last) ||
        (config->port_range.last > UINT16_MAX) ||
        ((config->port_range.first == 0) && (config->port_range.last != 0))) {
        ucs_error("%s=%u-%u is not a range of UDP ports",
                  UCT_USNIC_CONFIG_VAR("PORT_RANGE"), config->port_range.first,
                  config->port_range.last);
        return UCS_ERR_INVALID_PARAM;
    }

    if (config->async_tick <= 0) {
        ucs_error("%s=%g must be positive (seconds)",
                  UCT_USNIC_CONFIG_VAR("ASYNC_TICK"), config->async_tick);
        return UCS_ERR_INVALID_PARAM;
    }

    if ((config->rto_min <= 0) || (config->rto_max < config->rto_min) ||
        (config->ack_delay < 0) || (config->ack_delay >= config->rto_min)) {
        ucs_error("%s=%g, %s=%g and %s=%g are inconsistent: need "
                  "0 <= ACK_DELAY < RTO_MIN <= RTO_MAX (seconds)",
                  UCT_USNIC_CONFIG_VAR("ACK_DELAY"), config->ack_delay,
                  UCT_USNIC_CONFIG_VAR("RTO_MIN"), config->rto_min,
                  UCT_USNIC_CONFIG_VAR("RTO_MAX"), config->rto_max);
        return UCS_ERR_INVALID_PARAM;
    }

    if ((config->bundle_delay < 0) ||
        (config->bundle_delay >= config->rto_min)) {
        ucs_error("%s=%g must be at least 0 and below %s=%g (seconds)",
                  UCT_USNIC_CONFIG_VAR("BUNDLE_DELAY"), config->bundle_delay,
                  UCT_USNIC_CONFIG_VAR("RTO_MIN"), config->rto_min);
        return UCS_ERR_INVALID_PARAM;
    }

    return UCS_OK;
}

static ucs_status_t uct_usnic_iface_query(uct_iface_h tl_iface,
                                          uct_iface_attr_t *iface_attr)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);

    uct_base_iface_query(&iface->super, iface_attr);

    iface_attr->cap.flags          = UCT_IFACE_FLAG_AM_SHORT |
                                     UCT_IFACE_FLAG_AM_BCOPY |
                                     UCT_IFACE_FLAG_AM_ZCOPY |
                                     UCT_IFACE_FLAG_PUT_SHORT |
                                     UCT_IFACE_FLAG_PUT_BCOPY |
                                     UCT_IFACE_FLAG_PUT_ZCOPY |
                                     UCT_IFACE_FLAG_GET_BCOPY |
                                     UCT_IFACE_FLAG_GET_ZCOPY |
                                     UCT_IFACE_FLAG_PENDING |
                                     UCT_IFACE_FLAG_CB_SYNC |
                                     UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE |
                                     UCT_IFACE_FLAG_EP_CHECK |
                                     UCT_IFACE_FLAG_CONNECT_TO_IFACE |
                                     UCT_IFACE_FLAG_INTER_NODE;
    if (iface->event_set != NULL) {
        iface_attr->cap.event_flags = UCT_IFACE_FLAG_EVENT_SEND_COMP |
                                      UCT_IFACE_FLAG_EVENT_RECV |
                                      UCT_IFACE_FLAG_EVENT_FD;
    }
    iface_attr->cap.am.max_short   = iface->config.max_payload;
    iface_attr->cap.am.max_bcopy   = iface->config.max_bcopy;
    iface_attr->cap.am.min_zcopy   = 0;
    iface_attr->cap.am.max_zcopy   = iface->config.max_bcopy;
    iface_attr->cap.am.opt_zcopy_align = 1;
    iface_attr->cap.am.align_mtu   = 1;
    iface_attr->cap.am.max_iov     = UCT_USNIC_ZCOPY_MAX_IOV;
    iface_attr->cap.am.max_hdr     = UCT_USNIC_AM_ZCOPY_MAX_HDR;
    iface_attr->cap.put.max_short  = iface->config.put_max_payload;
    iface_attr->cap.put.max_bcopy  = iface->config.put_max_bcopy;
    iface_attr->cap.put.min_zcopy  = 0;
    iface_attr->cap.put.max_zcopy  = iface->config.put_max_bcopy;
    iface_attr->cap.put.opt_zcopy_align = 1;
    iface_attr->cap.put.align_mtu  = 1;
    iface_attr->cap.put.max_iov    = UCT_USNIC_ZCOPY_MAX_IOV;
    iface_attr->cap.get.max_bcopy  = iface->config.get_max;
    iface_attr->cap.get.min_zcopy  = 0;
    iface_attr->cap.get.max_zcopy  = iface->config.get_max_zcopy;
    iface_attr->cap.get.opt_zcopy_align = 1;
    iface_attr->cap.get.align_mtu  = 1;
    iface_attr->cap.get.max_iov    = UCT_USNIC_MAX_IOV;
    iface_attr->device_addr_len    = sizeof(uct_usnic_device_addr_t);
    iface_attr->iface_addr_len     = sizeof(uct_usnic_iface_addr_t);
    iface_attr->ep_addr_len        = 0;
    iface_attr->max_conn_priv      = 0;
    iface_attr->latency            = ucs_linear_func_make(iface->latency, 0);
    iface_attr->bandwidth.dedicated = 0;
    iface_attr->bandwidth.shared    = iface->bandwidth;
    iface_attr->overhead           = iface->overhead;
    iface_attr->priority           = 0;
    return UCS_OK;
}

ucs_status_t uct_usnic_iface_get_device_address(uct_iface_h tl_iface,
                                                uct_device_addr_t *addr)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);

    memcpy(addr, &iface->dev_addr, sizeof(iface->dev_addr));
    return UCS_OK;
}

ucs_status_t uct_usnic_iface_get_address(uct_iface_h tl_iface,
                                         uct_iface_addr_t *addr)
{
    uct_usnic_iface_t *iface         = ucs_derived_of(tl_iface,
                                                      uct_usnic_iface_t);
    uct_usnic_iface_addr_t *if_addr  = (uct_usnic_iface_addr_t*)addr;
    uct_usnic_channel_id_t id;

    for (id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        if_addr->ports[id] = iface->channels[id].addr.sin_port;
    }
    if_addr->incarnation = iface->incarnation;
    if_addr->open_key    = iface->open_key;
    if_addr->mtu         = uct_usnic_iface_dgram_size(iface);
    if_addr->prefix      = iface->config.prefix;
    return UCS_OK;
}

static int uct_usnic_in_addr_is_loopback(uint32_t in_addr)
{
    return (ntohl(in_addr) >> 24) == IN_LOOPBACKNET;
}

int uct_usnic_dev_addr_reaches(const uct_usnic_device_addr_t *local,
                               uint32_t in_addr)
{
    uint32_t mask = (local->prefix_len == 0) ? 0 :
                    htonl(UINT32_MAX << (32 - local->prefix_len));

    return (in_addr & mask) == (local->in_addr & mask);
}

static int
uct_usnic_iface_is_reachable_v2(const uct_iface_h tl_iface,
                                const uct_iface_is_reachable_params_t *params)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);
    const uct_usnic_device_addr_t *local = &iface->dev_addr;
    const uct_usnic_device_addr_t *remote;
    const uct_usnic_iface_addr_t *if_addr;
    size_t dev_addr_len, iface_addr_len;

    if (!uct_iface_is_reachable_params_valid(
                params, UCT_IFACE_IS_REACHABLE_FIELD_DEVICE_ADDR)) {
        return 0;
    }

    dev_addr_len = UCT_USNIC_REACHABLE_LENGTH(params, device_addr_length,
                                              DEVICE_ADDR_LENGTH,
                                              sizeof(*remote));
    remote       = (const uct_usnic_device_addr_t*)params->device_addr;
    if ((dev_addr_len < sizeof(*remote)) ||
        (remote->magic != UCT_USNIC_DEV_ADDR_MAGIC) ||
        (remote->prefix_len > 32)) {
        uct_iface_fill_info_str_buf(params, "not a usnic device address");
        return 0;
    }

    if (params->field_mask & UCT_IFACE_IS_REACHABLE_FIELD_IFACE_ADDR) {
        iface_addr_len = UCT_USNIC_REACHABLE_LENGTH(params, iface_addr_length,
                                                    IFACE_ADDR_LENGTH,
                                                    sizeof(*if_addr));
        if_addr        = (const uct_usnic_iface_addr_t*)params->iface_addr;
        if ((iface_addr_len < sizeof(*if_addr)) || (if_addr == NULL) ||
            (if_addr->ports[UCT_USNIC_CHANNEL_PRIO] == 0) ||
            (if_addr->ports[UCT_USNIC_CHANNEL_DATA] == 0)) {
            uct_iface_fill_info_str_buf(params, "invalid usnic iface address");
            return 0;
        }
    }

    if (UCT_USNIC_REACHABLE_SCOPE(params) ==
        UCT_IFACE_REACHABILITY_SCOPE_DEVICE) {
        if (remote->in_addr != local->in_addr) {
            uct_iface_fill_info_str_buf(params, "different device");
            return 0;
        }
    }

    /* 127.0.0.0/8 leads to the peer only inside the same network namespace */
    if ((uct_usnic_in_addr_is_loopback(local->in_addr) ||
         uct_usnic_in_addr_is_loopback(remote->in_addr)) &&
        (remote->ns_id != local->ns_id)) {
        uct_iface_fill_info_str_buf(params,
                                    "loopback in another network namespace "
                                    "or host");
        return 0;
    }

    if (!uct_usnic_dev_addr_reaches(local, remote->in_addr)) {
        uct_iface_fill_info_str_buf(params, "different subnet");
        return 0;
    }

    return 1;
}
UCT_USNIC_IFACE_IS_REACHABLE_ADAPTER(uct_usnic_iface_is_reachable_v2)

/*
 * ACKs and control first, so that the window opens before new data is
 * taken in; then received data; then what the send engine owes: ACKs,
 * retransmissions, pending requests.
 */
static UCS_F_ALWAYS_INLINE int
uct_usnic_iface_timers_due(uct_usnic_iface_t *iface, ucs_time_t now)
{
    return !ucs_twheel_is_empty(&iface->tx_wheel) &&
           ((now - ucs_twheel_get_time(&iface->tx_wheel)) >=
            iface->tx_wheel.res);
}

static unsigned uct_usnic_iface_progress(uct_iface_h tl_iface)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);
    /* One clock read serves a call that finds nothing: a spinning user pays
     * it once per poll of the data channel */
    ucs_time_t now           = ucs_get_time();
    unsigned count;

    uct_usnic_iface_enter(iface);
    /* Standalone ACKs are rare where replies carry them: their channel may
     * be skipped, but not when the timers are due: the ACKs that wait there
     * may spare a resend (an iface progressed now and then would otherwise
     * see every packet it sent time out); nor while the user waits for an
     * ACK to complete a zcopy send or a flush. Data is awaited at full
     * speed unless the user has been sending since the last call. */
    count  = uct_usnic_channel_poll(&iface->channels[UCT_USNIC_CHANNEL_PRIO],
                                    iface->config.max_poll,
                                    (iface->tx_awaited == 0) &&
                                    !uct_usnic_iface_timers_due(iface, now),
                                    now);
    count += uct_usnic_channel_poll(&iface->channels[UCT_USNIC_CHANNEL_DATA],
                                    iface->config.max_poll,
                                    iface->sent_since_progress, now);
    iface->sent_since_progress = 0;
    if (count > 0) {
        now = ucs_get_time(); /* Handling what came took time */
    }

    if (!ucs_list_is_empty(&iface->ack_streams)) {
        uct_usnic_rx_send_acks(iface, 0, now);
    }

    if (uct_usnic_iface_holds_msgs(iface)) {
        uct_usnic_bundle_progress(iface, 0);
    }

    if (uct_usnic_iface_timers_due(iface, now)) {
        count += uct_usnic_tx_progress_timers(iface, now);
    }

    if (ucs_unlikely(!ucs_list_is_empty(&iface->failed_eps))) {
        uct_usnic_ep_report_failures(iface);
        ++count;
    }

    if (iface->num_streams > 0) {
        uct_usnic_rx_reclaim_streams(iface, now);
    }

    if (!ucs_arbiter_is_empty(&iface->arbiter)) {
        iface->in_pending = 1;
        ucs_arbiter_dispatch(&iface->arbiter, 1, uct_usnic_ep_do_pending,
                             NULL);
        iface->in_pending = 0;
    }

    uct_usnic_iface_leave(iface);
    return count;
}

/*
 * Runs on the async thread, with the iface blocked from the user's side:
 * sends the ACKs that are due when nobody progresses this iface any more,
 * so that a peer waiting in flush does not depend on it.
 */
static void uct_usnic_iface_async_timer(int id, ucs_event_set_types_t events,
                                        void *arg)
{
    uct_usnic_iface_t *iface = arg;
    uint64_t expirations;

    /* A polled async context calls every handler on every poll */
    if ((iface->async_timer_fd >= 0) &&
        (read(iface->async_timer_fd, &expirations, sizeof(expirations)) !=
         sizeof(expirations))) {
        return;
    }

    if (!ucs_list_is_empty(&iface->ack_streams)) {
        uct_usnic_rx_send_acks(iface, 0, ucs_get_time());
    }

    /* A bundle does not wait for the user's next call */
    if (uct_usnic_iface_holds_msgs(iface)) {
        uct_usnic_bundle_progress(iface, 0);
    }

    /* Peer timeouts are found even while nobody progresses the iface */
    if (!ucs_twheel_is_empty(&iface->tx_wheel)) {
        uct_usnic_tx_check_timeouts(iface);
    }

    uct_usnic_iface_event_async(iface);
}

/*
 * The async timer ticks on a timerfd in the async thread's event set, not
 * with ucs_async_add_timer(): UCX's async thread waits for its timers in
 * whole milliseconds rounded down, and then polls through the last
 * millisecond of every period. On a core it shares with the user's thread
 * that was a 1 ms stall of the user's progress every tick, long enough for
 * the peers' retransmission timers to fire. An async context driven by
 * signals has no timerfd events: there, UCX's timer.
 */
static ucs_status_t uct_usnic_iface_async_init(uct_usnic_iface_t *iface,
                                               double tick)
{
    ucs_async_context_t *async = iface->super.worker->async;
    struct itimerspec spec;
    ucs_status_t status;

    iface->async_timer_fd = -1;
    if (async->mode == UCS_ASYNC_MODE_SIGNAL) {
        status = ucs_async_add_timer(async->mode, ucs_time_from_sec(tick),
                                     uct_usnic_iface_async_timer, iface,
                                     async, &iface->async_handler_id);
        if (status != UCS_OK) {
            ucs_error("usnic: cannot start the async timer: %s",
                      ucs_status_string(status));
        }
        return status;
    }

    iface->async_timer_fd = timerfd_create(CLOCK_MONOTONIC,
                                           TFD_NONBLOCK | TFD_CLOEXEC);
    if (iface->async_timer_fd < 0) {
        ucs_error("usnic: timerfd_create() failed: %m");
        return UCS_ERR_IO_ERROR;
    }

    spec.it_interval.tv_sec  = (time_t)tick;
    spec.it_interval.tv_nsec = (long)((tick - (time_t)tick) * UCS_NSEC_PER_SEC);
    if ((spec.it_interval.tv_sec == 0) && (spec.it_interval.tv_nsec == 0)) {
        spec.it_interval.tv_nsec = 1; /* Zero would disarm the timer */
    }
    spec.it_value            = spec.it_interval;
    if (timerfd_settime(iface->async_timer_fd, 0, &spec, NULL) != 0) {
        ucs_error("usnic: timerfd_settime(%.6f s) failed: %m", tick);
        status = UCS_ERR_IO_ERROR;
        goto err_close;
    }

    iface->async_handler_id = iface->async_timer_fd;
    status = ucs_async_set_event_handler(async->mode, iface->async_timer_fd,
                                         UCS_EVENT_SET_EVREAD |
                                         UCS_EVENT_SET_EDGE_TRIGGERED,
                                         uct_usnic_iface_async_timer, iface,
                                         async);
    if (status != UCS_OK) {
        ucs_error("usnic: cannot watch the async timer: %s",
                  ucs_status_string(status));
        goto err_close;
    }

    return UCS_OK;

err_close:
    close(iface->async_timer_fd);
    return status;
}

static void uct_usnic_iface_async_cleanup(uct_usnic_iface_t *iface)
{
    ucs_async_remove_handler(iface->async_handler_id, 1);
    if (iface->async_timer_fd >= 0) {
        close(iface->async_timer_fd);
    }
}

static UCS_F_ALWAYS_INLINE struct sockaddr_in
uct_usnic_iface_sockaddr(uint32_t in_addr, uint16_t port)
{
    struct sockaddr_in addr = {
        .sin_family      = AF_INET,
        .sin_port        = port,
        .sin_addr.s_addr = in_addr
    };

    return addr;
}

/* The async thread sends ACKs from the table: it is changed only with the
 * iface entered, as a new entry may move it */
ucs_status_t uct_usnic_iface_av_insert(uct_usnic_iface_t *iface,
                                       uint32_t in_addr, uint16_t port,
                                       fi_addr_t *fi_addr_p)
{
    struct sockaddr_in addr = uct_usnic_iface_sockaddr(in_addr, port);
    ucs_status_t status;

    uct_usnic_iface_enter(iface);
    status = uct_usnic_av_insert(&iface->av, &addr, fi_addr_p);
    uct_usnic_iface_leave(iface);
    return status;
}

void uct_usnic_iface_av_remove(uct_usnic_iface_t *iface, uint32_t in_addr,
                               uint16_t port)
{
    struct sockaddr_in addr = uct_usnic_iface_sockaddr(in_addr, port);

    uct_usnic_iface_enter(iface);
    uct_usnic_av_remove(&iface->av, &addr);
    uct_usnic_iface_leave(iface);
}

static ucs_status_t uct_usnic_iface_flush(uct_iface_h tl_iface, unsigned flags,
                                          uct_completion_t *comp)
{
    uct_usnic_iface_t *iface = ucs_derived_of(tl_iface, uct_usnic_iface_t);

    if (comp != NULL) {
        return UCS_ERR_UNSUPPORTED;
    }

    uct_usnic_iface_enter(iface);
    uct_usnic_bundle_progress(iface, 1);
    uct_usnic_iface_leave(iface);

    if ((iface->tx_outstanding > 0) || (iface->num_gets > 0)) {
        UCT_TL_IFACE_STAT_FLUSH_WAIT(&iface->super);
        return UCS_INPROGRESS;
    }

    UCT_TL_IFACE_STAT_FLUSH(&iface->super);
    return UCS_OK;
}

static ucs_status_t uct_usnic_iface_init_address(uct_usnic_iface_t *iface,
                                                  const uct_usnic_md_t *md)
{
    uct_usnic_device_addr_t *dev_addr = &iface->dev_addr;
    uct_usnic_channel_t *data         = &iface->channels[UCT_USNIC_CHANNEL_DATA];
    struct {
        uint32_t incarnation;
        uint32_t open_key;
    } secrets;
    ucs_status_t status;

    dev_addr->magic      = UCT_USNIC_DEV_ADDR_MAGIC;
    dev_addr->in_addr    = data->addr.sin_addr.s_addr;
    dev_addr->prefix_len = (md->prefix_len != UCT_USNIC_PREFIX_LEN_UNKNOWN) ?
                           md->prefix_len :
                           uct_usnic_netif_prefix_len(dev_addr->in_addr);
    dev_addr->ns_id      = ucs_get_system_id() ^
                           (ucs_sys_get_ns(UCS_SYS_NS_TYPE_NET) *
                            0x9e3779b97f4a7c15ul);
    /* Unguessable, so that nobody off the path can address this iface or
     * open a stream to it */
    status = uct_usnic_random(&secrets, sizeof(secrets));
    if (status != UCS_OK) {
        return status;
    }

    iface->incarnation = secrets.incarnation;
    iface->open_key    = secrets.open_key;
    return UCS_OK;
}

static void uct_usnic_iface_init_costs(uct_usnic_iface_t *iface,
                                       const uct_usnic_md_t *md,
                                       const char *dev_name,
                                       const char *provider)
{
    unsigned i;

    for (i = 0; i < ucs_static_array_size(uct_usnic_provider_costs) - 1;
         ++i) {
        if (!strcmp(uct_usnic_provider_costs[i].provider, provider)) {
            break;
        }
    }

    iface->latency   = uct_usnic_provider_costs[i].latency +
                       (md->prefer_nearest_device ?
                                uct_usnic_topo_dev_latency(&md->topo) : 0);
    iface->overhead  = uct_usnic_provider_costs[i].overhead;
    /* The link, or one datagram per overhead on each side if that is less */
    iface->bandwidth = ucs_min(((md->link_speed > 0) ? md->link_speed :
                                uct_usnic_netif_link_speed(dev_name)) / 8 *
                               iface->config.mtu /
                               (iface->config.mtu + UCT_USNIC_WIRE_OVERHEAD),
                               iface->config.mtu / (2 * iface->overhead));
}

static ucs_status_t
uct_usnic_iface_init_channels(uct_usnic_iface_t *iface, uct_usnic_md_t *md,
                              const uct_iface_params_t *params,
                              const uct_usnic_iface_config_t *config)
{
    uct_usnic_channel_params_t ch_params[UCT_USNIC_CHANNEL_LAST] = {
        [UCT_USNIC_CHANNEL_PRIO] = {
            .name         = uct_usnic_channel_names[UCT_USNIC_CHANNEL_PRIO],
            .rx_queue_len = config->prio_rx_queue_len,
            .rx_headroom  = 0,
            .rx_cb        = uct_usnic_rx_prio
        },
        [UCT_USNIC_CHANNEL_DATA] = {
            .name         = uct_usnic_channel_names[UCT_USNIC_CHANNEL_DATA],
            .coalesce     = 1,
            .rx_queue_len = config->rx_queue_len,
            .rx_headroom  = iface->config.rx_headroom,
            .am_offset    = sizeof(uct_usnic_hdr_t),
            .am_params    = params,
            .rx_cb        = uct_usnic_rx_data
        }
    };
    uct_usnic_seal_type_t seal_type = iface->config.seal_type;
    uct_usnic_seal_key_t key;
    uct_usnic_channel_id_t id;
    ucs_status_t status;

    if (seal_type == UCT_USNIC_SEAL_MAC) {
        status = uct_usnic_seal_key_load(UCT_USNIC_CONFIG_VAR("AUTH_KEY"),
                                         config->auth_key, &key);
        if (status != UCS_OK) {
            return status;
        }
    }

    for (id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        ch_params[id].tx_queue_len = config->tx_queue_len;
        ch_params[id].rx_batch     = config->rx_post_batch;
        ch_params[id].max_msg_size = iface->config.mtu +
                                     uct_usnic_seal_length(seal_type);
        ch_params[id].rx_mpool     = &config->rx_mpool;
        ch_params[id].forced_prefix = config->force_msg_prefix;
        ch_params[id].port_range   = &config->port_range;
        ch_params[id].wakeup       = config->event_fd;
        ch_params[id].seal_type    = seal_type;
        ch_params[id].seal_key     = &key;
        ch_params[id].id           = id;
        ch_params[id].max_skip     = ucs_time_from_sec(config->ack_delay);
        ch_params[id].fault        = &config->fault;

        status = uct_usnic_channel_init(&iface->channels[id], &iface->super,
                                        md, &iface->av, &ch_params[id]);
        if (status != UCS_OK) {
            goto err_cleanup;
        }
    }

    uct_usnic_seal_key_erase(&key);
    return UCS_OK;

err_cleanup:
    while (id-- > 0) {
        uct_usnic_channel_cleanup(&iface->channels[id]);
    }
    uct_usnic_seal_key_erase(&key);
    return status;
}

static void uct_usnic_iface_cleanup_channels(uct_usnic_iface_t *iface)
{
    uct_usnic_channel_id_t id;

    for (id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        uct_usnic_channel_cleanup(&iface->channels[id]);
    }
}

static void uct_usnic_am_buf_init(void *obj, void *mr_desc)
{
    uct_usnic_am_buf_t *am_buf = obj;

    am_buf->release.cb = uct_usnic_am_buf_release;
}

/* Send buffers, reassembly buffers, and the buffer am_bcopy packs into */
static ucs_status_t
uct_usnic_iface_init_buffers(uct_usnic_iface_t *iface, uct_usnic_md_t *md,
                             const uct_iface_params_t *params,
                             const uct_usnic_iface_config_t *config)
{
    size_t align, align_offset;
    ucs_status_t status;

    status = uct_usnic_md_mpool_init(md, &iface->tx_mp,
                                     iface->config.tx_hdr_offset +
                                     iface->config.mtu +
                                     UCT_USNIC_SEAL_MAX_LEN,
                                     0, UCS_SYS_CACHE_LINE_SIZE,
                                     &config->tx_mpool, 256, NULL,
                                     "usnic_tx_desc");
    if (status != UCS_OK) {
        return status;
    }

    status = uct_usnic_md_mpool_init(md, &iface->tx_zcopy_mp,
                                     iface->config.tx_hdr_offset +
                                     UCT_USNIC_TX_ZCOPY_BUF_LEN,
                                     0, UCS_SYS_CACHE_LINE_SIZE,
                                     &config->tx_mpool, 256, NULL,
                                     "usnic_tx_zcopy_desc");
    if (status != UCS_OK) {
        goto err_tx_mp;
    }

    status = uct_iface_param_am_alignment(params, iface->config.max_bcopy,
                                          iface->config.am_buf_offset,
                                          iface->config.am_buf_offset, &align,
                                          &align_offset);
    if (status != UCS_OK) {
        goto err_tx_zcopy_mp;
    }

    status = uct_usnic_md_mpool_init(md, &iface->am_buf_mp,
                                     iface->config.am_buf_offset +
                                     iface->config.max_bcopy,
                                     align_offset, align, &config->rx_mpool,
                                     16, uct_usnic_am_buf_init,
                                     "usnic_am_buf");
    if (status != UCS_OK) {
        goto err_tx_zcopy_mp;
    }

    status = uct_usnic_md_mpool_init(md, &iface->get_mp,
                                     sizeof(uct_usnic_get_t), 0,
                                     UCS_SYS_CACHE_LINE_SIZE,
                                     &config->tx_mpool, 64, NULL,
                                     "usnic_get");
    if (status != UCS_OK) {
        goto err_am_buf_mp;
    }

    iface->bcopy_buf = ucs_malloc(ucs_max(iface->config.max_bcopy,
                                          iface->config.put_max_bcopy),
                                  "usnic_bcopy_buf");
    if (iface->bcopy_buf == NULL) {
        ucs_error("failed to allocate usnic bcopy buffer");
        status = UCS_ERR_NO_MEMORY;
        goto err_get_mp;
    }

    iface->ack_buf = ucs_malloc(iface->config.prefix +
                                sizeof(uct_usnic_ack_packet_t) +
                                UCT_USNIC_SEAL_MAX_LEN, "usnic_ack_buf");
    if (iface->ack_buf == NULL) {
        ucs_error("failed to allocate usnic ACK buffer");
        status = UCS_ERR_NO_MEMORY;
        goto err_bcopy_buf;
    }

    /* Slots of a quarter to half a tick: an ep's timer fires within half a
     * tick of its time */
    status = ucs_twheel_init(&iface->tx_wheel, iface->config.timer_tick / 4,
                             ucs_get_time());
    if (status != UCS_OK) {
        goto err_ack_buf;
    }

    return UCS_OK;

err_ack_buf:
    ucs_free(iface->ack_buf);
err_bcopy_buf:
    ucs_free(iface->bcopy_buf);
err_get_mp:
    ucs_mpool_cleanup(&iface->get_mp, 1);
err_am_buf_mp:
    ucs_mpool_cleanup(&iface->am_buf_mp, 1);
err_tx_zcopy_mp:
    ucs_mpool_cleanup(&iface->tx_zcopy_mp, 1);
err_tx_mp:
    ucs_mpool_cleanup(&iface->tx_mp, 1);
    return status;
}

static void uct_usnic_iface_cleanup_buffers(uct_usnic_iface_t *iface)
{
    ucs_twheel_cleanup(&iface->tx_wheel);
    ucs_free(iface->ack_buf);
    ucs_free(iface->bcopy_buf);
    ucs_mpool_cleanup(&iface->get_mp, 1);
    ucs_mpool_cleanup(&iface->am_buf_mp, 1);
    ucs_mpool_cleanup(&iface->tx_zcopy_mp, 1);
    ucs_mpool_cleanup(&iface->tx_mp, 1);
}

/* The window a burst may fill at once: a quarter of the receive queue where
 * the transport sizes it (RX_QUEUE_LEN), else what the kernel's default
 * socket buffer holds */
static unsigned long
uct_usnic_iface_cwnd_init(const uct_usnic_iface_config_t *config,
                          const struct fi_info *info)
{
    const char *provider = info->fabric_attr->prov_name;

    if (config->cwnd_init != UCS_ULUNITS_AUTO) {
        return config->cwnd_init;
    }

    return (!strcmp(provider, UCT_USNIC_PROVIDER_KERNEL) ||
            !strcmp(provider, UCT_USNIC_PROVIDER_USNIC)) ?
                   UCT_USNIC_CWND_INIT_OWN_RXQ : UCT_USNIC_CWND_INIT_DEFAULT;
}

/* Sizes that follow from the configuration and the provider */
static void uct_usnic_iface_init_sizes(uct_usnic_iface_t *iface,
                                       const uct_iface_params_t *params,
                                       const uct_usnic_iface_config_t *config,
                                       const struct fi_info *info)
{
    size_t prefix = uct_usnic_channel_prefix(info, config->force_msg_prefix);

    /* A key's MAC stands in for the checksum */
    iface->config.seal_type         = (config->auth_key[0] != '\0') ?
                                      UCT_USNIC_SEAL_MAC :
                                      config->checksum ?
                                      UCT_USNIC_SEAL_CHECKSUM :
                                      UCT_USNIC_SEAL_NONE;
    /* The protocol's room excludes the seal */
    iface->config.prefix            = prefix;
    iface->config.mtu               = ((config->mtu == UCS_MEMUNITS_AUTO) ?
                                       uct_usnic_channel_max_dgram(info) :
                                       config->mtu) -
                                      uct_usnic_seal_length(
                                              iface->config.seal_type);
    iface->config.max_payload       = iface->config.mtu -
                                      sizeof(uct_usnic_hdr_t) -
                                      sizeof(uct_usnic_open_ext_t);
    iface->config.tx_max_bufs       = (config->tx_mpool.max_bufs < 0) ?
                                      UINT_MAX : config->tx_mpool.max_bufs;
    /* A message never needs more send buffers than there may be */
    iface->config.max_bcopy         = ucs_min(config->max_bcopy,
                                              (size_t)iface->config.tx_max_bufs *
                                              iface->config.max_payload);
    iface->config.put_max_payload   = iface->config.max_payload -
                                      sizeof(uct_usnic_put_ext_t);
    iface->config.put_max_bcopy     = ucs_min(config->put_max_bcopy,
                                              (size_t)iface->config.tx_max_bufs *
                                              iface->config.put_max_payload);
    iface->config.get_max_payload   = iface->config.max_payload -
                                      sizeof(uct_usnic_get_reply_ext_t);
    /* get_bcopy gathers the data in a reassembly buffer */
    iface->config.get_max           = ucs_min(iface->config.max_bcopy,
                                              iface->config.put_max_bcopy);
    iface->config.get_max_zcopy     = config->get_max_zcopy;
    iface->config.max_bcopy_packets =
            ucs_max(ucs_div_round_up(iface->config.max_bcopy,
                                     iface->config.max_payload),
                    ucs_div_round_up(iface->config.put_max_bcopy,
                                     iface->config.put_max_payload));
    iface->config.tx_hdr_offset     = sizeof(uct_usnic_tx_desc_t) + prefix;
    iface->config.rx_headroom       = UCT_IFACE_PARAM_VALUE(params,
                                                            rx_headroom,
                                                            RX_HEADROOM, 0);
    iface->config.am_buf_offset     = sizeof(uct_usnic_am_buf_t) +
                                      sizeof(uct_recv_desc_t*) +
                                      iface->config.rx_headroom;
    iface->config.max_poll          = config->max_poll;
    iface->config.window            = config->window;
    /* The congestion window never closes below one largest message */
    iface->config.cwnd_min          = iface->config.max_bcopy_packets;
    iface->config.cwnd_init         = ucs_min(ucs_max(
                                              uct_usnic_iface_cwnd_init(config,
                                                                        info),
                                              iface->config.cwnd_min),
                                              config->window);
    iface->config.ack_freq          = config->ack_freq;
    iface->config.ack_delay         = ucs_time_from_sec(config->ack_delay);
    iface->config.ack_max_recs      = ucs_max(1, ucs_min(
            UCT_USNIC_ACK_MAX_RECS,
            (iface->config.mtu - sizeof(uct_usnic_hdr_t) -
             sizeof(uct_usnic_ack_body_t)) / sizeof(uct_usnic_ack_rec_t)));
    /* Records of a bundle lie at any offset: no alignment for them */
    iface->config.bundle_delay      =
            ((params->field_mask & UCT_IFACE_PARAM_FIELD_AM_ALIGNMENT) &&
             (params->am_alignment > 1)) ?
            0 : ucs_time_from_sec(config->bundle_delay);
    iface->config.rto_min           = ucs_time_from_sec(config->rto_min);
    iface->config.rto_max           = ucs_time_from_sec(config->rto_max);
    /* Wheel slots are a quarter of it, at least one clock tick */
    iface->config.timer_tick        = ucs_max(iface->config.rto_min / 4, 4);
    iface->config.max_resend        = config->max_resend;
    iface->config.stats_summary     = config->stats_summary;
    iface->config.timeout           = ucs_time_from_sec(config->timeout);
    iface->config.max_streams       = config->max_streams;
    iface->config.max_ooo           = config->max_ooo;
    iface->config.ooo_ring_size     = ucs_min(ucs_roundup_pow2(
            (unsigned)config->stream_max_ooo), config->window);
    iface->config.max_reassembly    = config->max_reassembly;
    /* Its sender would have resent within RTO_MAX */
    iface->config.stream_idle       = ucs_time_from_sec(
            ucs_max(config->stream_idle, 2 * config->rto_max));
}

/*
 * Pair the peer's ep and stream once both exist. A second ep or stream to the
 * same peer iface stays unpaired: its ACKs travel standalone.
 */
void uct_usnic_iface_peer_link(uct_usnic_iface_t *iface, uint32_t incarnation,
                               uct_usnic_ep_t *ep,
                               uct_usnic_rx_stream_t *stream)
{
    uct_usnic_peer_t *peer;
    khiter_t iter;
    int ret;

    iter = kh_put(uct_usnic_peers, &iface->peers, incarnation, &ret);
    if (ret < 0) {
        return;
    }

    peer = &kh_value(&iface->peers, iter);
    if (ret != 0) {
        peer->ep      = NULL;
        peer->stream  = NULL;
        peer->num_eps = 0;
        peer->closed  = 0;
        peer->closed_streams = 0;
        peer->closed_time    = 0;
    }

    if (ep != NULL) {
        ++peer->num_eps;
        peer->closed = 0;
        if (peer->ep != NULL) {
            return;
        }
        peer->ep = ep;
    } else {
        if (peer->stream != NULL) {
            return;
        }
        peer->stream = stream;
    }

    if ((peer->ep != NULL) && (peer->stream != NULL)) {
        peer->ep->ack_stream = peer->stream;
        peer->stream->ack_ep = peer->ep;
    }
}

/* Undo uct_usnic_iface_peer_link(); forget the peer once nothing is left */
void uct_usnic_iface_peer_unlink(uct_usnic_iface_t *iface,
                                 uint32_t incarnation, uct_usnic_ep_t *ep,
                                 uct_usnic_rx_stream_t *stream)
{
    khiter_t iter = kh_get(uct_usnic_peers, &iface->peers, incarnation);
    uct_usnic_peer_t *peer;

    if (iter == kh_end(&iface->peers)) {
        return;
    }

    peer = &kh_value(&iface->peers, iter);
    if (ep != NULL) {
        peer->closed         = (--peer->num_eps == 0);
        peer->closed_streams = iface->streams_opened;
        peer->closed_time    = ucs_get_time();
    }

    if (((ep != NULL) && (peer->ep == ep)) ||
        ((stream != NULL) && (peer->stream == stream))) {
        if ((peer->ep != NULL) && (peer->stream != NULL)) {
            peer->ep->ack_stream = NULL;
            peer->stream->ack_ep = NULL;
        }

        if (ep != NULL) {
            peer->ep = NULL;
        } else {
            peer->stream = NULL;
        }
    }

    /* A closed peer is remembered while a stream from it lives */
    if ((peer->num_eps == 0) && (peer->stream == NULL)) {
        kh_del(uct_usnic_peers, &iface->peers, iter);
    }
}

int uct_usnic_iface_peer_closed(uct_usnic_iface_t *iface,
                                const uct_usnic_rx_stream_t *stream)
{
    khiter_t iter = kh_get(uct_usnic_peers, &iface->peers,
                           uct_usnic_rx_stream_peer(stream));

    /* A peer's new ep may have opened its stream while our last ep to it
     * was being destroyed (UCP discards force-closed eps lazily) and ours
     * to it is about to be created: only a close that has lasted is one */
    return (iter != kh_end(&iface->peers)) &&
           kh_value(&iface->peers, iter).closed &&
           (stream->open_seq < kh_value(&iface->peers, iter).closed_streams) &&
           (uct_usnic_elapsed(ucs_get_time(),
                              kh_value(&iface->peers, iter).closed_time) >=
            ucs_time_from_msec(UCT_USNIC_PEER_CLOSE_GRACE_MS));
}

static void uct_usnic_iface_cleanup_tables(uct_usnic_iface_t *iface)
{
    ucs_arbiter_cleanup(&iface->arbiter);
    kh_destroy_inplace(uct_usnic_reply_eps, &iface->reply_eps);
    kh_destroy_inplace(uct_usnic_peers, &iface->peers);
    kh_destroy_inplace(uct_usnic_senders, &iface->senders);
    ucs_ptr_array_cleanup(&iface->gets, 1);
    kh_destroy_inplace(uct_usnic_streams, &iface->stream_hash);
    ucs_ptr_array_cleanup(&iface->streams, 1);
    ucs_ptr_array_cleanup(&iface->eps, 1);
}

static UCS_CLASS_DECLARE_DELETE_FUNC(uct_usnic_iface_t, uct_iface_t);

static uct_iface_ops_t uct_usnic_iface_ops = {
    .ep_am_short              = uct_usnic_ep_am_short,
    .ep_am_short_iov          = uct_usnic_ep_am_short_iov,
    .ep_am_bcopy              = uct_usnic_ep_am_bcopy,
    .ep_am_zcopy              = uct_usnic_ep_am_zcopy,
    .ep_put_short             = uct_usnic_ep_put_short,
    .ep_put_bcopy             = uct_usnic_ep_put_bcopy,
    .ep_put_zcopy             = uct_usnic_ep_put_zcopy,
    .ep_get_bcopy             = uct_usnic_ep_get_bcopy,
    .ep_get_zcopy             = uct_usnic_ep_get_zcopy,
    .ep_pending_add           = uct_usnic_ep_pending_add,
    .ep_pending_purge         = uct_usnic_ep_pending_purge,
    .ep_flush                 = uct_usnic_ep_flush,
    .ep_check                 = uct_usnic_ep_check,
    .ep_fence                 = uct_base_ep_fence,
    .ep_create                = uct_usnic_ep_create,
    .ep_destroy               = UCS_CLASS_DELETE_FUNC_NAME(uct_usnic_ep_t),
    .iface_flush              = uct_usnic_iface_flush,
    .iface_fence              = uct_base_iface_fence,
    .iface_progress_enable    = uct_base_iface_progress_enable,
    .iface_progress_disable   = uct_base_iface_progress_disable,
    .iface_progress           = uct_usnic_iface_progress,
    .iface_event_fd_get       = uct_usnic_iface_event_fd_get,
    .iface_event_arm          = uct_usnic_iface_event_arm,
    .iface_close              = UCS_CLASS_DELETE_FUNC_NAME(uct_usnic_iface_t),
    .iface_query              = uct_usnic_iface_query,
    .iface_get_device_address = uct_usnic_iface_get_device_address,
    .iface_get_address        = uct_usnic_iface_get_address,
    .iface_is_reachable       = UCT_USNIC_IFACE_IS_REACHABLE(
                                        uct_usnic_iface_is_reachable_v2)
};

UCT_USNIC_EP_INVALIDATE_ADAPTER(uct_usnic_ep_invalidate)

static uct_iface_internal_ops_t uct_usnic_iface_internal_ops = {
    .iface_estimate_perf = uct_base_iface_estimate_perf,
    .iface_vfs_refresh   = (uct_iface_vfs_refresh_func_t)ucs_empty_function,
    .ep_query            = (uct_ep_query_func_t)
            ucs_empty_function_return_unsupported,
    .ep_invalidate       = UCT_USNIC_EP_INVALIDATE(uct_usnic_ep_invalidate),
    UCT_USNIC_IFACE_INTERNAL_OPS_VERSIONED(uct_usnic_iface_is_reachable_v2,
                                           uct_usnic_ep_is_connected)
};

static UCS_CLASS_INIT_FUNC(uct_usnic_iface_t, uct_md_h tl_md,
                           uct_worker_h worker,
                           const uct_iface_params_t *params,
                           const uct_iface_config_t *tl_config)
{
    uct_usnic_md_t *md = ucs_derived_of(tl_md, uct_usnic_md_t);
    const uct_usnic_iface_config_t *config =
            ucs_derived_of(tl_config, uct_usnic_iface_config_t);
    const char *dev_name = md->info->domain_attr->name;
    ucs_status_t status;

    UCT_CHECK_PARAM(params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE,
                    "UCT_IFACE_PARAM_FIELD_OPEN_MODE is not defined");
    if (!(params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE)) {
        ucs_error("usnic: only UCT_IFACE_OPEN_MODE_DEVICE is supported");
        return UCS_ERR_UNSUPPORTED;
    }

    if (strcmp(params->mode.device.dev_name, dev_name) != 0) {
        ucs_error("usnic: md %s has no device %s", dev_name,
                  params->mode.device.dev_name);
        return UCS_ERR_NO_DEVICE;
    }

    UCS_CLASS_CALL_SUPER_INIT(uct_base_iface_t, &uct_usnic_iface_ops,
                              &uct_usnic_iface_internal_ops, tl_md, worker,
                              params,
                              tl_config UCS_STATS_ARG(
                                      (params->field_mask &
                                       UCT_IFACE_PARAM_FIELD_STATS_ROOT) ?
                                              params->stats_root :
                                              NULL)
                                      UCS_STATS_ARG(dev_name));

    status = uct_usnic_iface_check_config(config, md->info);
    if (status != UCS_OK) {
        return status;
    }

    uct_usnic_iface_init_sizes(self, params, config, md->info);
    /* Only the kernel provider sends a burst of messages with one system
     * call: elsewhere holding them back would only delay them */
    self->config.hold_delay = md->kernel ? self->config.bundle_delay : 0;
    if (self->config.mtu < (sizeof(uct_usnic_hdr_t) +
                            sizeof(uct_usnic_open_ext_t) + 64)) {
        ucs_error("usnic: provider %s sends at most %zu bytes at once, too "
                  "few for the protocol", md->info->fabric_attr->prov_name,
                  self->config.mtu);
        return UCS_ERR_UNSUPPORTED;
    }

    if (self->config.max_bcopy_packets > self->config.window) {
        ucs_error("%s=%zu and %s=%zu need %u datagrams, more than %s=%u",
                  UCT_USNIC_CONFIG_VAR("MAX_BCOPY"), config->max_bcopy,
                  UCT_USNIC_CONFIG_VAR("PUT_MAX_BCOPY"), config->put_max_bcopy,
                  self->config.max_bcopy_packets,
                  UCT_USNIC_CONFIG_VAR("WINDOW"), self->config.window);
        return UCS_ERR_INVALID_PARAM;
    }

    memset(self->stats, 0, sizeof(self->stats));
    status = UCS_STATS_NODE_ALLOC(&self->stats_node,
                                  &uct_usnic_iface_stats_class,
                                  self->super.stats, "-%p", self);
    if (status != UCS_OK) {
        return status;
    }

    self->put_refused_logged   = 0;
    self->put_refused_unlogged = 0;
    self->tx_outstanding   = 0;
    self->in_pending       = 0;
    self->sent_since_progress = 0;
    self->next_ep_serial   = 1;
    self->tx_awaited       = 0;
    ucs_ptr_array_init(&self->eps, "usnic_eps");
    ucs_ptr_array_init(&self->streams, "usnic_streams");
    ucs_ptr_array_init(&self->gets, "usnic_gets");
    self->num_gets         = 0;
    self->next_get_serial  = 1;
    self->streams_opened   = 0;
    self->num_streams      = 0;
    self->rx_ooo_count     = 0;
    self->rx_reassembling  = 0;
    self->next_reclaim_check = 0;
    kh_init_inplace(uct_usnic_reply_eps, &self->reply_eps);
    kh_init_inplace(uct_usnic_streams, &self->stream_hash);
    kh_init_inplace(uct_usnic_peers, &self->peers);
    kh_init_inplace(uct_usnic_senders, &self->senders);
    ucs_arbiter_init(&self->arbiter);
    ucs_list_head_init(&self->tx_timers_due);
    ucs_list_head_init(&self->failed_eps);
    ucs_list_head_init(&self->ack_streams);
    ucs_list_head_init(&self->streams_lru[0]);
    ucs_list_head_init(&self->streams_lru[1]);
    ucs_list_head_init(&self->bundle_eps);
    ucs_list_head_init(&self->held_eps);

    status = uct_usnic_iface_init_buffers(self, md, params, config);
    if (status != UCS_OK) {
        goto err_cleanup_tables;
    }

    /* Sockets connected to peers send from ports of their own */
    status = uct_usnic_av_open(&self->av, md,
                               (config->port_range.first == 0) ?
                               config->connected_peers : 0,
                               uct_usnic_sock_buf_size(
                                       config->tx_queue_len,
                                       self->config.mtu +
                                       uct_usnic_seal_length(
                                               self->config.seal_type)));
    if (status != UCS_OK) {
        goto err_cleanup_buffers;
    }

    status = uct_usnic_iface_init_channels(self, md, params, config);
    if (status != UCS_OK) {
        goto err_close_av;
    }

    self->event_set = NULL;
    self->wakeup_fd = -1;
    self->armed     = 0;
    if (config->event_fd) {
        status = uct_usnic_iface_event_init(self);
        if (status != UCS_OK) {
            goto err_cleanup_channels;
        }
    }

    status = uct_usnic_iface_init_address(self, md);
    if (status != UCS_OK) {
        goto err_cleanup_events;
    }

    uct_usnic_iface_init_costs(self, md, dev_name,
                               md->info->fabric_attr->prov_name);

    status = uct_usnic_iface_async_init(self, config->async_tick);
    if (status != UCS_OK) {
        goto err_cleanup_events;
    }

    ucs_debug("usnic iface %p: device %s mtu %zu incarnation 0x%x", self,
              dev_name, self->config.mtu, self->incarnation);
    return UCS_OK;

err_cleanup_events:
    uct_usnic_iface_event_cleanup(self);
err_cleanup_channels:
    uct_usnic_iface_cleanup_channels(self);
err_close_av:
    uct_usnic_av_close(&self->av);
err_cleanup_buffers:
    uct_usnic_iface_cleanup_buffers(self);
err_cleanup_tables:
    uct_usnic_iface_cleanup_tables(self);
    UCS_STATS_NODE_FREE(self->stats_node);
    return status;
}

/* What an iface did in its life: for the user who asked for it
 * (STATS_SUMMARY, at a level no log setting filters), else for whoever
 * debugs a run */
static void uct_usnic_iface_log_stats(uct_usnic_iface_t *iface)
{
    const uint64_t *stats    = iface->stats;
    const uint64_t *drop     = &stats[UCT_USNIC_IFACE_STAT_RX_DROP];
    const uct_usnic_md_t *md = ucs_derived_of(iface->super.md,
                                              uct_usnic_md_t);
    ucs_log_level_t level;

    if (iface->config.stats_summary) {
        level = UCS_LOG_LEVEL_PRINT;
    } else if (ucs_log_is_enabled(UCS_LOG_LEVEL_DEBUG)) {
        level = UCS_LOG_LEVEL_DEBUG;
    } else {
        return;
    }

    ucs_log_dispatch(__FILE__, __LINE__, __func__, level,
                     &ucs_global_opts.log_component,
                     "usnic iface %p (%s): tx %lu datagrams, %lu AMs bundled, "
                     "%lu messages held back, %lu resent (%lu timeouts, "
                     "%lu tail probes, %lu read replies revoked), %lu streams "
                     "opened again, %lu standalone ACKs in %lu datagrams and "
                     "%lu piggy-backed; "
                     "rx %lu datagrams, %lu ACKs, %lu streams reclaimed; "
                     "dropped: %lu invalid, %lu stale, %lu forged, "
                     "%lu no stream, %lu duplicate, %lu out of window, "
                     "%lu no resource, %lu PUT key, %lu PUT range, "
                     "%lu GET key, %lu GET range, %lu bad %s",
                     iface, md->info->domain_attr->name,
                     stats[UCT_USNIC_IFACE_STAT_TX_PACKETS],
                     stats[UCT_USNIC_IFACE_STAT_TX_BUNDLED],
                     stats[UCT_USNIC_IFACE_STAT_TX_HELD],
                     stats[UCT_USNIC_IFACE_STAT_TX_RESENDS],
                     stats[UCT_USNIC_IFACE_STAT_TX_TIMEOUTS],
                     stats[UCT_USNIC_IFACE_STAT_TX_TAIL_PROBES],
                     stats[UCT_USNIC_IFACE_STAT_TX_READS_REVOKED],
                     stats[UCT_USNIC_IFACE_STAT_TX_REOPENS],
                     stats[UCT_USNIC_IFACE_STAT_TX_ACKS],
                     stats[UCT_USNIC_IFACE_STAT_TX_ACK_DGRAMS],
                     stats[UCT_USNIC_IFACE_STAT_TX_PIGGY_ACKS],
                     stats[UCT_USNIC_IFACE_STAT_RX_PACKETS],
                     stats[UCT_USNIC_IFACE_STAT_RX_ACKS],
                     stats[UCT_USNIC_IFACE_STAT_RX_STREAMS_RECLAIMED],
                     drop[UCT_USNIC_RX_DROP_INVALID] +
                     iface->channels[UCT_USNIC_CHANNEL_PRIO].rx_oversized +
                     iface->channels[UCT_USNIC_CHANNEL_DATA].rx_oversized,
                     drop[UCT_USNIC_RX_DROP_STALE],
                     drop[UCT_USNIC_RX_DROP_FORGED],
                     drop[UCT_USNIC_RX_DROP_NO_STREAM],
                     drop[UCT_USNIC_RX_DROP_DUPLICATE],
                     drop[UCT_USNIC_RX_DROP_OUT_OF_WINDOW],
                     drop[UCT_USNIC_RX_DROP_NO_RESOURCE],
                     drop[UCT_USNIC_RX_DROP_PUT_KEY],
                     drop[UCT_USNIC_RX_DROP_PUT_RANGE],
                     drop[UCT_USNIC_RX_DROP_GET_KEY],
                     drop[UCT_USNIC_RX_DROP_GET_RANGE],
                     iface->channels[UCT_USNIC_CHANNEL_PRIO].rx_bad_seal +
                     iface->channels[UCT_USNIC_CHANNEL_DATA].rx_bad_seal,
                     uct_usnic_seal_name(iface->config.seal_type));
}

static UCS_CLASS_CLEANUP_FUNC(uct_usnic_iface_t)
{
    uct_usnic_rx_stream_t *stream;
    unsigned index;

    uct_usnic_iface_log_stats(self);

    uct_base_iface_progress_disable(&self->super.super,
                                    UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_usnic_iface_async_cleanup(self);

    uct_usnic_get_cleanup(self);

    /* Streams hold receive and reassembly buffers: release them first */
    ucs_ptr_array_for_each(stream, index, &self->streams) {
        uct_usnic_rx_stream_destroy(self, stream);
    }

    uct_usnic_iface_event_cleanup(self);
    uct_usnic_iface_cleanup_channels(self);

    uct_usnic_av_close(&self->av);
    uct_usnic_iface_cleanup_buffers(self);
    uct_usnic_iface_cleanup_tables(self);
    UCS_STATS_NODE_FREE(self->stats_node);
}

UCS_CLASS_DEFINE(uct_usnic_iface_t, uct_base_iface_t);

static UCS_CLASS_DEFINE_NEW_FUNC(uct_usnic_iface_t, uct_iface_t, uct_md_h,
                                 uct_worker_h, const uct_iface_params_t*,
                                 const uct_iface_config_t*);

static UCS_CLASS_DEFINE_DELETE_FUNC(uct_usnic_iface_t, uct_iface_t);

UCT_TL_DEFINE_ENTRY(&uct_usnic_component, usnic, uct_usnic_md_query_devices,
                    uct_usnic_iface_t, "USNIC_", uct_usnic_iface_config_table,
                    uct_usnic_iface_config_t);

UCT_SINGLE_TL_INIT(&uct_usnic_component, usnic, ctor, , )
