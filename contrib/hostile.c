/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

/*
 * A hostile network for the usnic transport: sniffs the genuine datagrams
 * between two peers on one interface (AF_PACKET, both directions) and sends
 * altered copies with the genuine source address and port (raw IPv4), or
 * floods a peer with datagrams that each open a new stream.
 *
 *   hostile -i IFACE -a PEER [-m MODES] [-r RATE] [-t SECONDS] [-l SEAL_LEN]
 *   hostile -i IFACE -a PEER -f COUNT [-r RATE] [-l SEAL_LEN]
 *
 * PEER is the address of the peer whose incoming traffic is altered (run
 * one instance on each side to alter both directions), or which is
 * flooded. SEAL_LEN (4: the default checksum, 16: UCX_USNIC_AUTH_KEY's MAC,
 * 0) tells where the datagram's seal starts. MODES, comma-separated:
 *
 *   blind:    replay, bit flips in the first 64 bytes, truncation,
 *             extension, random bytes: the seal is left as it was
 *   offpath:  what an attacker off the path could send, knowing the
 *             protocol, addresses, ports, incarnations, stream ids and
 *             sequence numbers, but not the stream's 64-bit token: data
 *             and ACKs with a random token, an open trailer taking over a
 *             genuine stream; sealed with a valid checksum
 *   aware:    what a protocol-aware attacker on the path can send: the
 *             genuine token kept, sequence numbers moved ahead, payload
 *             bits flipped, ACKs for what was never received, random
 *             selective ACKs; sealed with a valid checksum (stopped only by
 *             UCX_USNIC_AUTH_KEY)
 *
 * With -f, sends COUNT datagrams that each open a stream from a fresh
 * sender identity (random incarnation, ep serial, token and ports, the
 * genuine sender's address), to the peer's data port, incarnation and open
 * key learned from the first genuine stream-opening datagram sniffed (with
 * -w, only SECONDS after it: the streams opened meanwhile are in use when
 * the flood comes): a third keep a packet out of order, a third start a message of several
 * datagrams, a third are probes. None delivers a message: a forger who
 * knows the open key could, and without UCX_USNIC_AUTH_KEY nothing stops
 * that; the flood is about the memory a receiver keeps.
 *
 * Prints what it sent, per kind, on exit. Forged packets carry a DSCP mark
 * so that the sniffer never takes them for genuine ones.
 */

#include <uct/usnic/usnic_proto.h>

#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <math.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>


#define HOSTILE_TOS      0x28 /* DSCP AF11: marks our own packets */

#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#  define VIRTIO_NET_HDR_GSO_UDP_L4 5 /* Linux 6.2's uapi headers */
#endif
#define HOSTILE_MAX_DGRAM 65536


typedef enum {
    KIND_REPLAY,
    KIND_FLIP,
    KIND_TRUNCATE,
    KIND_EXTEND,
    KIND_RANDOM,
    KIND_WRONG_TOKEN,
    KIND_WRONG_ACK_TOKEN,
    KIND_PREEMPT,
    KIND_PSN_AHEAD,
    KIND_PAYLOAD_FLIP,
    KIND_ACK_AHEAD,
    KIND_SACK,
    KIND_OPEN,
    KIND_LAST
} hostile_kind_t;

enum {
    MODE_BLIND   = 1 << 0,
    MODE_OFFPATH = 1 << 1,
    MODE_AWARE   = 1 << 2
};

static const struct {
    const char *name;
    unsigned   mode;
} hostile_kinds[] = {
    [KIND_REPLAY]         = {"replay", MODE_BLIND},
    [KIND_FLIP]           = {"bit flips", MODE_BLIND},
    [KIND_TRUNCATE]       = {"truncated", MODE_BLIND},
    [KIND_EXTEND]         = {"extended", MODE_BLIND},
    [KIND_RANDOM]         = {"random bytes", MODE_BLIND},
    [KIND_WRONG_TOKEN]    = {"data, random token", MODE_OFFPATH},
    [KIND_WRONG_ACK_TOKEN] = {"ACK, random token", MODE_OFFPATH},
    [KIND_PREEMPT]        = {"stream taken over", MODE_OFFPATH},
    [KIND_PSN_AHEAD]      = {"psn ahead", MODE_AWARE},
    [KIND_PAYLOAD_FLIP]   = {"payload flipped", MODE_AWARE},
    [KIND_ACK_AHEAD]      = {"ACK for unreceived", MODE_AWARE},
    [KIND_SACK]           = {"random SACK", MODE_AWARE},
    [KIND_OPEN]           = {"stream opened", 0}
};

static struct {
    int           sniff_fd;
    int           raw_fd;
    uint32_t      peer;      /* Network order */
    unsigned      modes;
    double        rate;      /* Forged datagrams per second */
    double        seconds;
    double        flood_wait; /* From the genuine open to the flood */
    size_t        seal_len;
    unsigned long flood;
    unsigned long sent[KIND_LAST];
    unsigned long sniffed;
    volatile int  stop;
} hostile = {
    .rate     = 3000,
    .seal_len = 4
};


static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rand64(void)
{
    uint64_t value;

    if (getrandom(&value, sizeof(value), 0) != sizeof(value)) {
        value = ((uint64_t)random() << 32) ^ random();
    }
    return value;
}

static uint16_t inet_sum(const void *data, size_t length, uint32_t sum)
{
    const uint8_t *p = data;

    for (; length > 1; p += 2, length -= 2) {
        sum += (p[0] << 8) | p[1];
    }
    if (length > 0) {
        sum += p[0] << 8;
    }
    while (sum >> 16) {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    return sum;
}

/* Send payload as a UDP datagram from src to dst (network order) */
static void send_udp(uint32_t src, uint16_t sport, uint32_t dst,
                     uint16_t dport, const void *payload, size_t length,
                     hostile_kind_t kind)
{
    static uint8_t packet[sizeof(struct iphdr) + sizeof(struct udphdr) +
                          HOSTILE_MAX_DGRAM];
    struct iphdr *ip   = (struct iphdr*)packet;
    struct udphdr *udp = (struct udphdr*)(ip + 1);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = dst};
    struct {
        uint32_t src, dst;
        uint8_t  zero, proto;
        uint16_t length;
    } __attribute__((packed)) pseudo;
    uint16_t sum;

    if (length > (HOSTILE_MAX_DGRAM - sizeof(*ip) - sizeof(*udp))) {
        return;
    }

    memset(ip, 0, sizeof(*ip));
    ip->version  = 4;
    ip->ihl      = 5;
    ip->tos      = HOSTILE_TOS;
    ip->tot_len  = htons(sizeof(*ip) + sizeof(*udp) + length);
    ip->ttl      = 64;
    ip->protocol = IPPROTO_UDP;
    ip->saddr    = src;
    ip->daddr    = dst;
    udp->source  = sport;
    udp->dest    = dport;
    udp->len     = htons(sizeof(*udp) + length);
    udp->check   = 0;
    memcpy(udp + 1, payload, length);

    pseudo.src    = src;
    pseudo.dst    = dst;
    pseudo.zero   = 0;
    pseudo.proto  = IPPROTO_UDP;
    pseudo.length = udp->len;
    sum           = inet_sum(&pseudo, sizeof(pseudo), 0);
    sum           = ~inet_sum(udp, sizeof(*udp) + length, sum);
    udp->check    = htons(sum ? sum : 0xffff);

    if (sendto(hostile.raw_fd, packet, ntohs(ip->tot_len), 0,
               (struct sockaddr*)&to, sizeof(to)) >= 0) {
        ++hostile.sent[kind];
    }
}

/* What a protocol-aware forger does: a valid checksum over the altered
 * datagram (which a MAC key makes worthless) */
static void reseal(uint8_t *dgram, size_t length)
{
    uint32_t checksum;

    if (hostile.seal_len < sizeof(checksum)) {
        return;
    }

    checksum = (uint32_t)XXH3_64bits(dgram, length - hostile.seal_len);
    memcpy(dgram + length - hostile.seal_len, &checksum, sizeof(checksum));
}

/* The genuine datagram, as the protocol parses it */
static uct_usnic_hdr_t *parse(uint8_t *dgram, size_t length)
{
    uct_usnic_hdr_t *hdr = (uct_usnic_hdr_t*)dgram;

    if ((length < (sizeof(*hdr) + hostile.seal_len)) ||
        (hdr->version != UCT_USNIC_PROTO_VERSION)) {
        return NULL;
    }
    return hdr;
}

/* Records of a standalone ACK; 0 if it is none */
static size_t ack_recs(const uct_usnic_hdr_t *hdr, size_t length)
{
    size_t head = sizeof(*hdr) + sizeof(uct_usnic_ack_body_t) +
                  hostile.seal_len;

    if ((hdr->type != UCT_USNIC_PKT_ACK) || (length <= head) ||
        (((length - head) % sizeof(uct_usnic_ack_rec_t)) != 0)) {
        return 0;
    }
    return (length - head) / sizeof(uct_usnic_ack_rec_t);
}

static int is_ack(const uct_usnic_hdr_t *hdr, size_t length)
{
    return ack_recs(hdr, length) > 0;
}

/* One stream's ACK among those a standalone ACK carries, NULL if none */
static uct_usnic_ack_rec_t *pick_ack(uct_usnic_hdr_t *hdr, size_t length)
{
    size_t count = (hdr != NULL) ? ack_recs(hdr, length) : 0;

    return (count == 0) ? NULL :
           (uct_usnic_ack_rec_t*)((uct_usnic_ack_body_t*)(hdr + 1) + 1) +
           rand64() % count;
}

/* One altered copy of a genuine datagram of the given kind; 0 if the kind
 * does not apply to it */
static size_t forge(hostile_kind_t kind, const uint8_t *orig, size_t length,
                    uint8_t *dgram)
{
    uct_usnic_hdr_t *hdr;
    uct_usnic_ack_rec_t *ack;
    uct_usnic_open_ext_t *open;
    size_t i, body;

    memcpy(dgram, orig, length);
    hdr = parse(dgram, length);
    ack = pick_ack(hdr, length);

    switch (kind) {
    case KIND_REPLAY:
        return length;
    case KIND_FLIP:
        for (i = 0; i <= rand64() % 3; ++i) {
            dgram[rand64() % ((length < 64) ? length : 64)] ^=
                    1 << (rand64() % 8);
        }
        return length;
    case KIND_TRUNCATE:
        return (length > 1) ? (1 + rand64() % (length - 1)) : 0;
    case KIND_EXTEND:
        for (i = 0; i < 1 + rand64() % 64; ++i) {
            dgram[length + i] = rand64();
        }
        return length + i;
    case KIND_RANDOM:
        for (i = 0; i < length; ++i) {
            dgram[i] = rand64();
        }
        return length;
    case KIND_WRONG_TOKEN:
        if ((hdr == NULL) || is_ack(hdr, length)) {
            return 0;
        }
        hdr->token = rand64();
        break;
    case KIND_WRONG_ACK_TOKEN:
        if (ack == NULL) {
            return 0;
        }
        ack->ack.token = rand64();
        ack->ack.psn  += 1 + rand64() % 8;
        break;
    case KIND_PREEMPT:
        /* The genuine stream's open trailer, another token */
        if ((hdr == NULL) || !(hdr->flags & UCT_USNIC_PKT_FLAG_OPEN) ||
            (hdr->type == UCT_USNIC_PKT_ACK)) {
            return 0;
        }
        hdr->token = rand64();
        open       = (uct_usnic_open_ext_t*)(dgram + length -
                                             hostile.seal_len -
                                             sizeof(*open));
        open->src_prio_port = htons(1024 + rand64() % 60000);
        break;
    case KIND_PSN_AHEAD:
        if ((hdr == NULL) || is_ack(hdr, length)) {
            return 0;
        }
        hdr->psn += 1 + rand64() % 8;
        break;
    case KIND_PAYLOAD_FLIP:
        body = length - hostile.seal_len - sizeof(*hdr);
        if ((hdr == NULL) || is_ack(hdr, length) || (body == 0)) {
            return 0;
        }
        dgram[sizeof(*hdr) + rand64() % body] ^= 1 << (rand64() % 8);
        break;
    case KIND_ACK_AHEAD:
        if (ack == NULL) {
            return 0;
        }
        ack->ack.psn += 1 + rand64() % 64;
        break;
    case KIND_SACK:
        if (ack == NULL) {
            return 0;
        }
        ack->sack = rand64();
        break;
    default:
        return 0;
    }

    reseal(dgram, length);
    return length;
}

/*
 * Read one genuine IPv4/UDP datagram from or to the peer (on an Ethernet
 * interface); its payload. A
 * segmentation-offload send shows up as one packet holding a burst of
 * datagrams, gso_size bytes each but the last: one of them is taken.
 */
static ssize_t sniff(uint8_t *buf, size_t size, struct iphdr **ip_p,
                     struct udphdr **udp_p)
{
    struct virtio_net_hdr *vnet = (struct virtio_net_hdr*)buf;
    struct ether_header *eth    = (struct ether_header*)(vnet + 1);
    struct iphdr *ip            = (struct iphdr*)(eth + 1);
    struct udphdr *udp;
    size_t length, segs, seg;
    ssize_t ret;

    ret = recv(hostile.sniff_fd, buf, size, 0);
    if (ret < (ssize_t)(sizeof(*vnet) + sizeof(*eth) + sizeof(*ip) +
                        sizeof(*udp))) {
        return -1;
    }

    if ((eth->ether_type != htons(ETHERTYPE_IP)) || (ip->version != 4) ||
        (ip->protocol != IPPROTO_UDP) || (ip->tos == HOSTILE_TOS) ||
        ((ip->saddr != hostile.peer) && (ip->daddr != hostile.peer)) ||
        ((sizeof(*vnet) + sizeof(*eth) + ntohs(ip->tot_len)) >
         (size_t)ret)) {
        return -1;
    }

    udp    = (struct udphdr*)((uint8_t*)ip + ip->ihl * 4);
    length = ntohs(udp->len) - sizeof(*udp);
    if ((vnet->gso_type == VIRTIO_NET_HDR_GSO_UDP_L4) &&
        (vnet->gso_size > 0) && (length > vnet->gso_size)) {
        segs   = (length + vnet->gso_size - 1) / vnet->gso_size;
        seg    = rand64() % segs;
        /* The chosen one goes right behind the UDP header */
        memmove(udp + 1, (uint8_t*)(udp + 1) + seg * vnet->gso_size,
                (seg == (segs - 1)) ? (length - seg * vnet->gso_size) :
                                      vnet->gso_size);
        length = (seg == (segs - 1)) ? (length - seg * vnet->gso_size) :
                                       vnet->gso_size;
    }

    *ip_p  = ip;
    *udp_p = udp;
    ++hostile.sniffed;
    return length;
}

/* Alter genuine datagrams, cycling through the kinds of the modes asked */
static void run_alter(void)
{
    static uint8_t buf[HOSTILE_MAX_DGRAM], dgram[HOSTILE_MAX_DGRAM + 64];
    double start = now_sec(), budget = 0, last = start, now;
    hostile_kind_t kind = 0;
    struct pollfd pfd = {.fd = hostile.sniff_fd, .events = POLLIN};
    struct udphdr *udp;
    struct iphdr *ip;
    ssize_t length;
    size_t forged;
    unsigned tries;

    while (!hostile.stop &&
           ((hostile.seconds <= 0) || ((now_sec() - start) < hostile.seconds))) {
        if (poll(&pfd, 1, 100) <= 0) {
            continue;
        }

        length = sniff(buf, sizeof(buf), &ip, &udp);
        now    = now_sec();
        budget = fmin(budget + (now - last) * hostile.rate, 64);
        last   = now;
        if ((length <= 0) || (budget < 1) || (ip->daddr != hostile.peer)) {
            continue;
        }

        /* The next kind that applies to this datagram */
        for (tries = 0; tries < KIND_LAST; ++tries) {
            kind = (kind + 1) % KIND_LAST;
            if (!(hostile_kinds[kind].mode & hostile.modes)) {
                continue;
            }
            forged = forge(kind, (uint8_t*)(udp + 1), length, dgram);
            if (forged > 0) {
                send_udp(ip->saddr, udp->source, ip->daddr, udp->dest, dgram,
                         forged, kind);
                budget -= 1;
                break;
            }
        }
    }
}

/* Datagrams that each open a stream from a fresh sender identity */
static void run_flood(void)
{
    static uint8_t buf[HOSTILE_MAX_DGRAM];
    struct {
        uct_usnic_hdr_t      hdr;
        uint64_t             payload;
        uct_usnic_open_ext_t open;
        uint8_t              seal[16];
    } __attribute__((packed)) dgram;
    size_t length = sizeof(dgram) - sizeof(dgram.seal) + hostile.seal_len;
    double start, interval = 1.0 / hostile.rate;
    uct_usnic_open_ext_t *open;
    uct_usnic_hdr_t *hdr;
    struct udphdr *udp;
    struct iphdr *ip;
    ssize_t ret;
    unsigned long i;

    /* The peer's data port, incarnation and open key, from a genuine
     * packet that opens a stream there */
    do {
        ret  = sniff(buf, sizeof(buf), &ip, &udp);
        hdr  = (ret > 0) ? parse((uint8_t*)(udp + 1), ret) : NULL;
    } while (!hostile.stop &&
             ((hdr == NULL) || (ip->daddr != hostile.peer) ||
              (hdr->type == UCT_USNIC_PKT_ACK) ||
              !(hdr->flags & UCT_USNIC_PKT_FLAG_OPEN)));
    if (hostile.stop) {
        return;
    }
    open = (uct_usnic_open_ext_t*)((uint8_t*)(udp + 1) + ret -
                                   hostile.seal_len - sizeof(*open));

    start = now_sec();
    while (!hostile.stop && ((now_sec() - start) < hostile.flood_wait)) {
        usleep(10000);
    }

    fprintf(stderr, "hostile: flooding %s:%u (incarnation 0x%x) with %lu "
            "stream opens\n", inet_ntoa(*(struct in_addr*)&ip->daddr),
            ntohs(udp->dest), hdr->incarnation, hostile.flood);
    start = now_sec();
    for (i = 0; (i < hostile.flood) && !hostile.stop; ++i) {
        memset(&dgram, 0, sizeof(dgram));
        dgram.hdr.version          = UCT_USNIC_PROTO_VERSION;
        dgram.hdr.type             = UCT_USNIC_PKT_AM;
        dgram.hdr.am_id            = hdr->am_id;
        dgram.hdr.incarnation      = hdr->incarnation;
        dgram.hdr.stream_id        = UCT_USNIC_STREAM_ID_NONE;
        dgram.hdr.token            = rand64();
        dgram.open.src_incarnation = rand64();
        dgram.open.src_ep_id       = rand64() % 1024;
        dgram.open.src_ep_serial   = rand64();
        dgram.open.src_in_addr     = ip->saddr;
        dgram.open.src_prio_port   = htons(1024 + rand64() % 60000);
        dgram.open.src_data_port   = htons(1024 + rand64() % 60000);
        dgram.open.first_psn       = rand64();
        dgram.open.dst_open_key    = open->dst_open_key;
        dgram.hdr.psn              = dgram.open.first_psn;
        dgram.hdr.flags            = UCT_USNIC_PKT_FLAG_OPEN;
        switch (i % 3) {
        case 0: /* kept out of order */
            dgram.hdr.psn   += 1 + rand64() % 64;
            dgram.hdr.flags |= UCT_USNIC_PKT_FLAG_FIRST |
                               UCT_USNIC_PKT_FLAG_LAST;
            break;
        case 1: /* starts a message of several datagrams */
            dgram.hdr.flags |= UCT_USNIC_PKT_FLAG_FIRST;
            break;
        default: /* a probe: acknowledged, nothing delivered */
            dgram.hdr.type   = UCT_USNIC_PKT_PROBE;
            dgram.hdr.am_id  = 0;
            dgram.hdr.flags |= UCT_USNIC_PKT_FLAG_FIRST |
                               UCT_USNIC_PKT_FLAG_LAST;
            break;
        }
        reseal((uint8_t*)&dgram, length);
        send_udp(ip->saddr, udp->source, ip->daddr, udp->dest, &dgram, length,
                 KIND_OPEN);

        while ((now_sec() - start) < (i * interval)) {
        }
    }
}

static void on_signal(int sig)
{
    (void)sig;
    hostile.stop = 1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: hostile -i IFACE -a PEER [-m blind,offpath,aware] "
            "[-r RATE] [-t SECONDS] [-l SEAL_LEN]\n"
            "       hostile -i IFACE -a PEER -f COUNT [-w SECONDS] [-r RATE] "
            "[-l SEAL_LEN]\n");
    exit(2);
}

static unsigned parse_modes(char *list)
{
    unsigned modes = 0;
    char *name;

    for (name = strtok(list, ","); name != NULL; name = strtok(NULL, ",")) {
        if (!strcmp(name, "blind")) {
            modes |= MODE_BLIND;
        } else if (!strcmp(name, "offpath")) {
            modes |= MODE_OFFPATH;
        } else if (!strcmp(name, "aware")) {
            modes |= MODE_AWARE;
        } else {
            usage();
        }
    }
    return modes;
}

int main(int argc, char **argv)
{
    /* Only ETH_P_ALL taps see what the host itself sends */
    struct sockaddr_ll ll = {.sll_family   = AF_PACKET,
                             .sll_protocol = htons(ETH_P_ALL)};
    char modes[] = "blind,offpath";
    const char *ifname = NULL;
    struct sigaction sa;
    int c, k, one = 1;

    hostile.modes = parse_modes(modes);
    while ((c = getopt(argc, argv, "i:a:m:r:t:l:f:w:")) != -1) {
        switch (c) {
        case 'i':
            ifname = optarg;
            break;
        case 'a':
            if (inet_pton(AF_INET, optarg, &hostile.peer) != 1) {
                usage();
            }
            break;
        case 'm':
            hostile.modes = parse_modes(optarg);
            break;
        case 'r':
            hostile.rate = atof(optarg);
            break;
        case 't':
            hostile.seconds = atof(optarg);
            break;
        case 'l':
            hostile.seal_len = atoi(optarg);
            break;
        case 'f':
            hostile.flood = strtoul(optarg, NULL, 0);
            break;
        case 'w':
            hostile.flood_wait = atof(optarg);
            break;
        default:
            usage();
        }
    }
    if ((ifname == NULL) || (hostile.peer == 0) || (hostile.rate <= 0) ||
        (hostile.seal_len > 16)) {
        usage();
    }

    ll.sll_ifindex   = if_nametoindex(ifname);
    /* Raw frames: only they come with the segmentation-offload header */
    hostile.sniff_fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    hostile.raw_fd   = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
    if ((ll.sll_ifindex == 0) || (hostile.sniff_fd < 0) ||
        (hostile.raw_fd < 0) ||
        (setsockopt(hostile.sniff_fd, SOL_PACKET, PACKET_VNET_HDR, &one,
                    sizeof(one)) != 0) ||
        (bind(hostile.sniff_fd, (struct sockaddr*)&ll, sizeof(ll)) != 0)) {
        perror("hostile: cannot sniff and send raw datagrams (needs root)");
        return 1;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    if (hostile.flood > 0) {
        run_flood();
    } else {
        run_alter();
    }

    printf("hostile: %lu genuine datagrams seen; sent:", hostile.sniffed);
    for (k = 0; k < KIND_LAST; ++k) {
        if (hostile.sent[k] > 0) {
            printf(" %s %lu,", hostile_kinds[k].name, hostile.sent[k]);
        }
    }
    printf("\n");
    return 0;
}
