/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

/*
 * libFuzzer target for the receive path of the usnic transport.
 *
 * Two ifaces on device "lo" (receiver R and sender S) are opened once, with
 * an ep each way, a memory region registered for remote writes, and a few
 * AMs and PUTs exchanged so that eps, ACK state and the warm paths exist.
 * Each input is then a sequence of datagrams handed to a channel exactly as
 * uct_usnic_channel_progress() hands a completed receive to the protocol.
 *
 * Input: a sequence of records
 *   1 byte   selector: bit 0 target iface (0: R, 1: S)
 *                      bit 1 channel (0: data, 1: priority)
 *                      bit 2 progress the worker once after this datagram
 *   2 bytes  datagram length, little-endian (cut to what is left)
 *   N bytes  the datagram
 *
 * Marker values, so that the fuzzer reaches paths guarded by random values
 * it cannot guess (each is replaced in the copy the module sees):
 *   - header incarnation 0: the target iface's incarnation;
 *   - open trailer src_incarnation 0: the other iface's incarnation (so
 *     serial 1 names the other iface's ep to the target, ep id 0);
 *   - open trailer src_in_addr 0: the other iface's address; any other
 *     address is moved into 127.0.0.0/8, so that ACKs the module sends to
 *     it never leave the host, even outside a network namespace;
 *   - open trailer ports 0: the other iface's priority/data ports;
 *   - open trailer open keys 0: the target's (dst), the other's (src);
 *   - standalone ACK body src_incarnation 0: the other iface's incarnation;
 *   - PUT secret 0: the live registration's secret (its id is 0);
 *   - PUT address below 2^32: the registered region's start plus the low
 *     32 bits taken as a signed offset.
 * The two eps' random secrets are set to values the inputs can name: token
 * 0, sequence numbers from 1.
 *
 * Every input starts from the same state: after it, the rx streams it left
 * are destroyed (in descending id order, so ids are handed out the same way
 * next time) and descriptors the AM handler kept are released. An input must therefore open its streams
 * itself, with an open trailer; the first stream it opens on an iface has
 * id 0. UCX_USNIC_ACK_DELAY is 0 so that ACKs do not depend on timing.
 * The ifaces are re-created every UCT_USNIC_FUZZ_RESET_RUNS inputs, so that
 * what an input leaves beyond its streams (the eps that reply to reads,
 * for one) cannot pile up.
 *
 * With UCT_USNIC_FUZZ_WRITE_SEEDS=<dir> the binary writes its seed corpus
 * to <dir> and exits.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include <uct/usnic/usnic_ep.h>
#include <uct/usnic/usnic_rx.h>

#include <ucs/async/async.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sanitizer/asan_interface.h>


#define UCT_USNIC_FUZZ_DEV          "lo"
#define UCT_USNIC_FUZZ_RX_HEADROOM  16
#define UCT_USNIC_FUZZ_REGION_SIZE  4096
#define UCT_USNIC_FUZZ_RESET_RUNS   20000
#define UCT_USNIC_FUZZ_PROGRESS     17   /* > POLL_INTERVAL: every channel */
#define UCT_USNIC_FUZZ_MAX_KEPT     256
#define UCT_USNIC_FUZZ_KEEP_AM_ID   16   /* AM ids from here are kept */
#define UCT_USNIC_FUZZ_BCOPY_LEN    3000 /* Several datagrams */
#define UCT_USNIC_FUZZ_PUT_LEN      64
#define UCT_USNIC_FUZZ_REC_HDR      3

enum {
    UCT_USNIC_FUZZ_SEL_SENDER   = UCS_BIT(0),
    UCT_USNIC_FUZZ_SEL_PRIO     = UCS_BIT(1),
    UCT_USNIC_FUZZ_SEL_PROGRESS = UCS_BIT(2)
};

enum {
    UCT_USNIC_FUZZ_R,
    UCT_USNIC_FUZZ_S,
    UCT_USNIC_FUZZ_NUM_IFACES
};


typedef struct uct_usnic_fuzz_iface {
    uct_iface_h             iface;
    uct_usnic_iface_t       *usnic;
    uct_iface_attr_t        attr;
    uct_usnic_device_addr_t dev_addr;
    uct_usnic_iface_addr_t  iface_addr;
    uct_ep_h                ep;             /* To the other iface */
    unsigned                am_count;       /* Delivered to the handler */
} uct_usnic_fuzz_iface_t;


static struct {
    ucs_async_context_t    *async;
    uct_worker_h           worker;
    uct_component_h        component;
    uct_md_h               md;
    uct_iface_config_t     *iface_config;
    void                   *region;
    uct_mem_h              memh;
    uct_usnic_rkey_t       rkey;           /* Packed key of the region */
    uct_rkey_bundle_t      rkey_bundle;
    uct_usnic_fuzz_iface_t ifaces[UCT_USNIC_FUZZ_NUM_IFACES];
    void                   *kept[UCT_USNIC_FUZZ_MAX_KEPT];
    unsigned               num_kept;
    unsigned long          runs;
    volatile uint8_t       sink;           /* Keeps the byte reads alive */
} uct_usnic_fuzz;


#define uct_usnic_fuzz_check(_cond, _fmt, ...) \
    do { \
        if (!(_cond)) { \
            fprintf(stderr, "fuzz_rx: " _fmt "\n", ## __VA_ARGS__); \
            abort(); \
        } \
    } while (0)

#define uct_usnic_fuzz_check_ok(_status, _what) \
    uct_usnic_fuzz_check((_status) == UCS_OK, "%s failed: %s", _what, \
                         ucs_status_string(_status))


/*
 * Reads every byte of a message, so that ASan sees an over-read, and writes
 * the headroom the user asked for, so that it sees a missing one. Keeps the
 * descriptor of high AM ids to exercise UCT_CB_PARAM_FLAG_DESC.
 */
static ucs_status_t uct_usnic_fuzz_am_cb(void *arg, void *data, size_t length,
                                         unsigned flags)
{
    uct_usnic_fuzz_iface_t *fiface = arg;
    const uint8_t *p               = data;
    uint8_t sum                    = 0;
    size_t i;

    uct_usnic_fuzz_check(length <= fiface->attr.cap.am.max_bcopy,
                         "AM of %zu bytes, more than max_bcopy %zu", length,
                         fiface->attr.cap.am.max_bcopy);

    for (i = 0; i < length; ++i) {
        sum += p[i];
    }
    uct_usnic_fuzz.sink = sum;
    memset(UCS_PTR_BYTE_OFFSET(data, -UCT_USNIC_FUZZ_RX_HEADROOM), 0xa5,
           UCT_USNIC_FUZZ_RX_HEADROOM);
    ++fiface->am_count;
    return UCS_OK;
}

/* Same, but keeps the descriptor until the input is done */
static ucs_status_t uct_usnic_fuzz_am_keep_cb(void *arg, void *data,
                                              size_t length, unsigned flags)
{
    uct_usnic_fuzz_am_cb(arg, data, length, flags);
    if (!(flags & UCT_CB_PARAM_FLAG_DESC) ||
        (uct_usnic_fuzz.num_kept == UCT_USNIC_FUZZ_MAX_KEPT)) {
        return UCS_OK;
    }

    uct_usnic_fuzz.kept[uct_usnic_fuzz.num_kept++] =
            UCS_PTR_BYTE_OFFSET(data, -UCT_USNIC_FUZZ_RX_HEADROOM);
    return UCS_INPROGRESS;
}

static ucs_status_t uct_usnic_fuzz_err_cb(void *arg, uct_ep_h ep,
                                          ucs_status_t status)
{
    /* No packet is outstanding after the warm-up: nothing should fail */
    fprintf(stderr, "fuzz_rx: ep %p failed: %s\n", ep,
            ucs_status_string(status));
    return UCS_OK;
}

static size_t uct_usnic_fuzz_pack_cb(void *dest, void *arg)
{
    size_t length = *(size_t*)arg;

    memset(dest, 0x5a, length);
    return length;
}

static void uct_usnic_fuzz_progress(unsigned count)
{
    while (count-- > 0) {
        uct_worker_progress(uct_usnic_fuzz.worker);
    }
}

/* Send AMs (short and multi-datagram bcopy) and a PUT each way, and wait
 * until every one is acknowledged and delivered */
static void uct_usnic_fuzz_warm_up(void)
{
    size_t bcopy_len = UCT_USNIC_FUZZ_BCOPY_LEN;
    size_t put_len   = UCT_USNIC_FUZZ_PUT_LEN;
    uint64_t payload = 0x1122334455667788ul;
    ucs_time_t deadline;
    uct_usnic_fuzz_iface_t *fiface;
    ucs_status_t status;
    ssize_t packed;
    int i, done;

    for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
        fiface = &uct_usnic_fuzz.ifaces[i];
        status = uct_ep_am_short(fiface->ep, 0, 0, &payload, sizeof(payload));
        uct_usnic_fuzz_check_ok(status, "am_short");
        packed = uct_ep_am_bcopy(fiface->ep, 1, uct_usnic_fuzz_pack_cb,
                                 &bcopy_len, 0);
        uct_usnic_fuzz_check(packed == bcopy_len, "am_bcopy: %zd", packed);
        packed = uct_ep_put_bcopy(fiface->ep, uct_usnic_fuzz_pack_cb, &put_len,
                                  (uintptr_t)uct_usnic_fuzz.region,
                                  uct_usnic_fuzz.rkey_bundle.rkey);
        uct_usnic_fuzz_check(packed == put_len, "put_bcopy: %zd", packed);
    }

    deadline = ucs_get_time() + ucs_time_from_sec(10.0);
    do {
        uct_usnic_fuzz_check(ucs_get_time() < deadline,
                             "warm-up did not complete in 10 seconds");
        uct_usnic_fuzz_progress(1);
        done = 1;
        for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
            fiface = &uct_usnic_fuzz.ifaces[i];
            done  &= (fiface->am_count >= 2) &&
                     (uct_ep_flush(fiface->ep, 0, NULL) == UCS_OK);
        }
    } while (!done);
}

static void uct_usnic_fuzz_open_iface(uct_usnic_fuzz_iface_t *fiface)
{
    uct_iface_params_t params = {
        .field_mask         = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                              UCT_IFACE_PARAM_FIELD_DEVICE |
                              UCT_IFACE_PARAM_FIELD_RX_HEADROOM |
                              UCT_IFACE_PARAM_FIELD_ERR_HANDLER |
                              UCT_IFACE_PARAM_FIELD_ERR_HANDLER_ARG |
                              UCT_IFACE_PARAM_FIELD_ERR_HANDLER_FLAGS,
        .open_mode          = UCT_IFACE_OPEN_MODE_DEVICE,
        .mode.device        = {
            .tl_name  = UCT_USNIC_TL_NAME,
            .dev_name = UCT_USNIC_FUZZ_DEV
        },
        .rx_headroom        = UCT_USNIC_FUZZ_RX_HEADROOM,
        .err_handler        = uct_usnic_fuzz_err_cb,
        .err_handler_arg    = fiface,
        .err_handler_flags  = 0
    };
    ucs_status_t status;
    uint8_t id;

    status = uct_iface_open(uct_usnic_fuzz.md, uct_usnic_fuzz.worker, &params,
                            uct_usnic_fuzz.iface_config, &fiface->iface);
    uct_usnic_fuzz_check_ok(status, "uct_iface_open");
    fiface->usnic    = ucs_derived_of(fiface->iface, uct_usnic_iface_t);
    fiface->am_count = 0;

    status = uct_iface_query(fiface->iface, &fiface->attr);
    uct_usnic_fuzz_check_ok(status, "uct_iface_query");
    status = uct_iface_get_device_address(fiface->iface,
                                          (uct_device_addr_t*)
                                          &fiface->dev_addr);
    uct_usnic_fuzz_check_ok(status, "uct_iface_get_device_address");
    status = uct_iface_get_address(fiface->iface,
                                   (uct_iface_addr_t*)&fiface->iface_addr);
    uct_usnic_fuzz_check_ok(status, "uct_iface_get_address");

    for (id = 0; id < UCT_AM_ID_MAX; ++id) {
        status = uct_iface_set_am_handler(fiface->iface, id,
                                          (id < UCT_USNIC_FUZZ_KEEP_AM_ID) ?
                                          uct_usnic_fuzz_am_cb :
                                          uct_usnic_fuzz_am_keep_cb,
                                          fiface, 0);
        uct_usnic_fuzz_check_ok(status, "uct_iface_set_am_handler");
    }

    uct_iface_progress_enable(fiface->iface,
                              UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
}

static void uct_usnic_fuzz_connect(uct_usnic_fuzz_iface_t *fiface,
                                   const uct_usnic_fuzz_iface_t *peer)
{
    uct_ep_params_t params = {
        .field_mask = UCT_EP_PARAM_FIELD_IFACE |
                      UCT_EP_PARAM_FIELD_DEV_ADDR |
                      UCT_EP_PARAM_FIELD_IFACE_ADDR,
        .iface      = fiface->iface,
        .dev_addr   = (const uct_device_addr_t*)&peer->dev_addr,
        .iface_addr = (const uct_iface_addr_t*)&peer->iface_addr
    };
    uct_usnic_ep_t *ep;

    uct_usnic_fuzz_check_ok(uct_ep_create(&params, &fiface->ep),
                            "uct_ep_create");

    /* Secrets the fuzzer can name: token 0, sequence from 1 */
    ep               = ucs_derived_of(fiface->ep, uct_usnic_ep_t);
    ep->token        = 0;
    ep->first_psn    = 1;
    ep->next_psn     = 1;
    ep->acked_psn    = 0;
    ep->recovery_psn = 0;
}

/* Destroy every rx stream, highest id first: the ids are then handed out
 * from 0 again, in order */
static void uct_usnic_fuzz_reset_streams(uct_usnic_iface_t *iface)
{
    uct_usnic_rx_stream_t *stream;
    unsigned index;

    for (index = iface->streams.size; index-- > 0;) {
        if (ucs_ptr_array_lookup(&iface->streams, index, stream)) {
            uct_usnic_rx_stream_destroy(iface, stream);
        }
    }
}

/* Bring both ifaces back to the state every input starts from */
static void uct_usnic_fuzz_reset(void)
{
    uct_usnic_fuzz_iface_t *fiface;
    unsigned i;

    for (i = 0; i < uct_usnic_fuzz.num_kept; ++i) {
        uct_iface_release_desc(uct_usnic_fuzz.kept[i]);
    }
    uct_usnic_fuzz.num_kept = 0;

    for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
        fiface = &uct_usnic_fuzz.ifaces[i];
        uct_usnic_iface_enter(fiface->usnic);
        uct_usnic_fuzz_reset_streams(fiface->usnic);
        uct_usnic_iface_leave(fiface->usnic);
    }
}

static void uct_usnic_fuzz_open_ifaces(void)
{
    uct_usnic_fuzz_iface_t *ifaces = uct_usnic_fuzz.ifaces;
    int i;

    for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
        uct_usnic_fuzz_open_iface(&ifaces[i]);
    }
    uct_usnic_fuzz_connect(&ifaces[UCT_USNIC_FUZZ_R],
                           &ifaces[UCT_USNIC_FUZZ_S]);
    uct_usnic_fuzz_connect(&ifaces[UCT_USNIC_FUZZ_S],
                           &ifaces[UCT_USNIC_FUZZ_R]);
    uct_usnic_fuzz_warm_up();

    uct_usnic_fuzz_progress(UCT_USNIC_FUZZ_PROGRESS);
    uct_usnic_fuzz_reset();
}

static void uct_usnic_fuzz_close_ifaces(void)
{
    int i;

    uct_usnic_fuzz_reset();
    for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
        uct_ep_destroy(uct_usnic_fuzz.ifaces[i].ep);
    }
    for (i = 0; i < UCT_USNIC_FUZZ_NUM_IFACES; ++i) {
        uct_iface_close(uct_usnic_fuzz.ifaces[i].iface);
    }
}

/* Replace the marker values (see the top of the file) in a datagram */
static void uct_usnic_fuzz_fixup(uct_usnic_fuzz_iface_t *target,
                                 const uct_usnic_fuzz_iface_t *other,
                                 uct_usnic_channel_id_t channel_id,
                                 void *data, size_t length)
{
    uct_usnic_hdr_t *hdr = data;
    size_t open_len      = 0;
    size_t ack_len       = 0;
    size_t min_body      = 0;
    uct_usnic_ack_body_t *ack_body;
    uct_usnic_open_ext_t *open;
    uct_usnic_put_ext_t *put;
    uint32_t in_addr;

    if (length < sizeof(*hdr)) {
        return;
    }

    if (hdr->incarnation == 0) {
        hdr->incarnation = target->usnic->incarnation;
    }

    if (channel_id == UCT_USNIC_CHANNEL_PRIO) {
        if (length >= (sizeof(*hdr) + sizeof(*ack_body))) {
            ack_body = (uct_usnic_ack_body_t*)(hdr + 1);
            if (ack_body->src_incarnation == 0) {
                ack_body->src_incarnation = other->usnic->incarnation;
            }
        }
        return;
    }

    /* Where the module looks for the trailers and the put header */
    if (hdr->flags & UCT_USNIC_PKT_FLAG_OPEN) {
        open_len = sizeof(uct_usnic_open_ext_t);
    }
    if (hdr->flags & UCT_USNIC_PKT_FLAG_ACK) {
        ack_len = sizeof(uct_usnic_ack_ext_t);
    }
    if (hdr->type == UCT_USNIC_PKT_PUT) {
        min_body = sizeof(uct_usnic_put_ext_t);
    }
    if (length < (sizeof(*hdr) + min_body + open_len + ack_len)) {
        return;
    }

    if (open_len != 0) {
        open = UCS_PTR_BYTE_OFFSET(data, length - open_len);
        if (open->src_incarnation == 0) {
            open->src_incarnation = other->usnic->incarnation;
        }
        in_addr = ntohl(open->src_in_addr);
        open->src_in_addr = (in_addr == 0) ? other->dev_addr.in_addr :
                            htonl((IN_LOOPBACKNET << 24) |
                                  (in_addr & 0xffffff));
        if (open->src_prio_port == 0) {
            open->src_prio_port =
                    other->iface_addr.ports[UCT_USNIC_CHANNEL_PRIO];
        }
        if (open->src_data_port == 0) {
            open->src_data_port =
                    other->iface_addr.ports[UCT_USNIC_CHANNEL_DATA];
        }
        if (open->dst_open_key == 0) {
            open->dst_open_key = target->usnic->open_key;
        }
        if (open->src_open_key == 0) {
            open->src_open_key = other->usnic->open_key;
        }
    }

    if (min_body != 0) {
        put = (uct_usnic_put_ext_t*)(hdr + 1);
        if (put->secret == 0) {
            put->secret = uct_usnic_fuzz.rkey.secret;
        }
        if ((put->address >> 32) == 0) {
            put->address = (uintptr_t)uct_usnic_fuzz.region +
                           (int64_t)(int32_t)(uint32_t)put->address;
        }
    }
}

/*
 * Hand one datagram to a channel the way uct_usnic_channel_progress() does
 * after fi_cq_read(): in a receive descriptor of the channel's pool, to its
 * rx callback with the time it came, the descriptor back to the pool unless
 * the callback kept it.
 * The unused rest of the descriptor is poisoned during the call: the pool's
 * buffers are contiguous, so ASan would not see an over-read otherwise.
 */
static void uct_usnic_fuzz_deliver(uct_usnic_fuzz_iface_t *target,
                                   const uct_usnic_fuzz_iface_t *other,
                                   uct_usnic_channel_id_t channel_id,
                                   const uint8_t *datagram, size_t length)
{
    uct_usnic_channel_t *channel = &target->usnic->channels[channel_id];
    size_t room                  = channel->max_msg_size;
    uct_usnic_rx_desc_t *desc;
    ucs_status_t status;
    size_t sealed;
    uint8_t *flip;
    void *data;

    length = ucs_min(length, room - channel->seal.length);

    uct_usnic_iface_enter(target->usnic);
    desc = ucs_mpool_get(&channel->rx_mp);
    uct_usnic_fuzz_check(desc != NULL, "%s: no receive descriptor",
                         channel->name);

    data = uct_usnic_rx_desc_data(channel, desc);
    memcpy(data, datagram, length);
    uct_usnic_fuzz_fixup(target, other, channel_id, data, length);
    if (channel->seal.length != 0) {
        /* What the channel checks and cuts off before the callback: its
         * checksum or MAC, computed and checked over every input */
        uct_usnic_seal_put(&channel->seal, data, length);
        sealed = length + channel->seal.length;
        uct_usnic_fuzz_check(uct_usnic_seal_check(&channel->seal, data,
                                                  &sealed) &&
                             (sealed == length),
                             "%s: a sealed datagram failed its check",
                             channel->name);
        flip   = UCS_PTR_BYTE_OFFSET(data, length +
                                           (length % channel->seal.length));
        *flip ^= 1;
        sealed = length + channel->seal.length;
        uct_usnic_fuzz_check(!uct_usnic_seal_check(&channel->seal, data,
                                                   &sealed),
                             "%s: an altered seal passed its check",
                             channel->name);
        *flip ^= 1;
    }

    ASAN_POISON_MEMORY_REGION(UCS_PTR_BYTE_OFFSET(data, length),
                              channel->max_msg_size - length);
    channel->rx_time = ucs_get_time();
    status           = channel->rx_cb(channel, desc, data, length);
    ASAN_UNPOISON_MEMORY_REGION(UCS_PTR_BYTE_OFFSET(data, length),
                                channel->max_msg_size - length);

    if (status == UCS_OK) {
        uct_usnic_channel_rx_desc_put(desc);
    } else {
        uct_usnic_fuzz_check(status == UCS_INPROGRESS,
                             "rx callback returned %s",
                             ucs_status_string(status));
    }
    uct_usnic_iface_leave(target->usnic);
}


/* Seed corpus */

typedef struct {
    uint8_t buf[8192];
    size_t  length;
} uct_usnic_fuzz_seed_t;

static void *uct_usnic_fuzz_seed_put(uct_usnic_fuzz_seed_t *seed,
                                     const void *data, size_t length)
{
    void *dest = seed->buf + seed->length;

    ucs_assert_always(seed->length + length <= sizeof(seed->buf));
    if (data != NULL) {
        memcpy(dest, data, length);
    } else {
        memset(dest, 0x42, length);
    }
    seed->length += length;
    return dest;
}

/*
 * Append a record. type, flags, am_id, stream_id and psn go into the header
 * (incarnation 0: the live one); body is copied after it (NULL: filler); an
 * ACK trailer and an open trailer follow as the flags say, with the marker
 * values that name the other iface and its ep 0 of serial 1.
 */
static void uct_usnic_fuzz_seed_dgram(uct_usnic_fuzz_seed_t *seed,
                                      uint8_t sel, uint8_t type,
                                      uint8_t flags, uint8_t am_id,
                                      uint32_t stream_id, uint32_t psn,
                                      const void *body, size_t body_len,
                                      uint32_t ack_psn)
{
    uct_usnic_hdr_t hdr      = {
        .version     = UCT_USNIC_PROTO_VERSION,
        .type        = type,
        .flags       = flags,
        .am_id       = am_id,
        .incarnation = 0,
        .stream_id   = stream_id,
        .psn         = psn
    };
    uct_usnic_ack_ext_t ack  = {
        .ep_id     = 0,
        .stream_id = 0,
        .psn       = ack_psn,
        .token     = 0
    };
    uct_usnic_open_ext_t open = {
        .src_incarnation = 0,
        .src_ep_id       = 0,
        .src_ep_serial   = 1,
        .first_psn       = 1
    };
    size_t length = sizeof(hdr) + body_len +
                    ((flags & UCT_USNIC_PKT_FLAG_ACK) ? sizeof(ack) : 0) +
                    ((flags & UCT_USNIC_PKT_FLAG_OPEN) ? sizeof(open) : 0);
    uint8_t rec[UCT_USNIC_FUZZ_REC_HDR] = {sel, length & 0xff, length >> 8};

    uct_usnic_fuzz_seed_put(seed, rec, sizeof(rec));
    uct_usnic_fuzz_seed_put(seed, &hdr, sizeof(hdr));
    uct_usnic_fuzz_seed_put(seed, body, body_len);
    if (flags & UCT_USNIC_PKT_FLAG_ACK) {
        uct_usnic_fuzz_seed_put(seed, &ack, sizeof(ack));
    }
    if (flags & UCT_USNIC_PKT_FLAG_OPEN) {
        uct_usnic_fuzz_seed_put(seed, &open, sizeof(open));
    }
}

/* A standalone ACK on the priority channel */
static void uct_usnic_fuzz_seed_ack(uct_usnic_fuzz_seed_t *seed, uint8_t sel,
                                    uint32_t ack_psn, uint64_t sack)
{
    struct {
        uct_usnic_hdr_t      hdr;
        uct_usnic_ack_body_t body;
        uct_usnic_ack_rec_t  rec;
    } UCS_S_PACKED packet = {
        .hdr  = {
            .version = UCT_USNIC_PROTO_VERSION,
            .type    = UCT_USNIC_PKT_ACK
        },
        .rec  = {
            .ack  = {.ep_id = 0, .stream_id = 0, .psn = ack_psn,
                     .token = 0},
            .sack = sack
        }
    };
    uint8_t rec[UCT_USNIC_FUZZ_REC_HDR] = {sel | UCT_USNIC_FUZZ_SEL_PRIO,
                                           sizeof(packet), 0};

    uct_usnic_fuzz_seed_put(seed, rec, sizeof(rec));
    uct_usnic_fuzz_seed_put(seed, &packet, sizeof(packet));
}

static void uct_usnic_fuzz_seed_raw(uct_usnic_fuzz_seed_t *seed, uint8_t sel,
                                    const void *data, size_t length)
{
    uint8_t rec[UCT_USNIC_FUZZ_REC_HDR] = {sel, length & 0xff, length >> 8};

    uct_usnic_fuzz_seed_put(seed, rec, sizeof(rec));
    uct_usnic_fuzz_seed_put(seed, data, length);
}

static void uct_usnic_fuzz_seed_write(const char *dir, const char *name,
                                      uct_usnic_fuzz_seed_t *seed)
{
    char path[PATH_MAX];
    FILE *file;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    file = fopen(path, "wb");
    uct_usnic_fuzz_check(file != NULL, "cannot create %s: %m", path);
    uct_usnic_fuzz_check(fwrite(seed->buf, 1, seed->length, file) ==
                         seed->length, "cannot write %s", path);
    fclose(file);
    seed->length = 0;
}

static void uct_usnic_fuzz_write_seeds(const char *dir)
{
    /* Packets the warm-up sent on each ep: 1 am_short, 3 bcopy, 1 put */
    const uint32_t sent      = 5;
    const uint8_t single     = UCT_USNIC_PKT_FLAG_FIRST |
                               UCT_USNIC_PKT_FLAG_LAST;
    const uint8_t open       = UCT_USNIC_PKT_FLAG_OPEN;
    const uint32_t none      = UCT_USNIC_STREAM_ID_NONE;
    const uint8_t R          = 0;
    const uint8_t S          = UCT_USNIC_FUZZ_SEL_SENDER;
    const uint8_t AM         = UCT_USNIC_PKT_AM;
    uct_usnic_put_ext_t put  = {.secret = 0, .address = 16, .rkey_id = 0,
                                .length = 64, .offset = 0};
    uint8_t body[1400 + sizeof(put)];
    uct_usnic_bundle_rec_t bundle_rec = {0};
    uint8_t bundle[3 * (sizeof(bundle_rec) + 8)] = {0};
    uct_usnic_hdr_t bad_hdr;
    unsigned i;
    static const uint8_t padded[] = {1, 2, 3, 4, 5, 0, 0, 3};
    static uct_usnic_fuzz_seed_t seed;

    memset(body, 0x33, sizeof(body));
    memcpy(body, &put, sizeof(put));

    /* AM, one datagram, opening the stream; to R and to S */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 0, none, 1, NULL,
                              32, 0);
    uct_usnic_fuzz_seed_write(dir, "am-open", &seed);
    uct_usnic_fuzz_seed_dgram(&seed, S, AM, single | open, 3, none, 1, NULL,
                              1, 0);
    uct_usnic_fuzz_seed_write(dir, "am-open-to-sender", &seed);

    /* Open, then continue on the stream id (0) and on the open key */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 0, none, 1, NULL,
                              8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 1, 0, 2, NULL, 100, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 2, none, 3, NULL,
                              0, 0);
    uct_usnic_fuzz_seed_write(dir, "am-continue", &seed);

    /* Multi-datagram AM, then one whose fragments arrive out of order */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST | open,
                              4, none, 1, NULL, 1400, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, 0, 4, 0, 2, NULL, 1400, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_LAST, 4, 0, 3,
                              NULL, 700, 0);
    uct_usnic_fuzz_seed_write(dir, "am-multi", &seed);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST | open,
                              5, none, 1, NULL, 1000, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_LAST, 5, 0, 3,
                              NULL, 10, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R | UCT_USNIC_FUZZ_SEL_PROGRESS, AM, 0,
                              5, 0, 2, NULL, 1000, 0);
    uct_usnic_fuzz_seed_write(dir, "am-multi-ooo", &seed);

    /* Equal fragments, the last padded (5 bytes of data, 3 of padding) */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST | open,
                              6, none, 1, NULL, 8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM,
                              UCT_USNIC_PKT_FLAG_LAST |
                              UCT_USNIC_PKT_FLAG_PADDED, 6, 0, 2, padded,
                              sizeof(padded), 0);
    uct_usnic_fuzz_seed_write(dir, "am-multi-padded", &seed);

    /* A new message starting inside another; a continuation without start */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST | open,
                              6, none, 1, NULL, 500, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST, 6, 0,
                              2, NULL, 500, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_LAST, 6, 0, 3,
                              NULL, 500, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_LAST, 6, 0, 4,
                              NULL, 5, 0);
    uct_usnic_fuzz_seed_write(dir, "am-nested", &seed);

    /* AMs the handler keeps, single and reassembled */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open,
                              UCT_USNIC_FUZZ_KEEP_AM_ID, none, 1, NULL, 64,
                              0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST,
                              UCT_USNIC_FUZZ_KEEP_AM_ID + 1, 0, 2, NULL, 1400,
                              0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_LAST,
                              UCT_USNIC_FUZZ_KEEP_AM_ID + 1, 0, 3, NULL, 1400,
                              0);
    uct_usnic_fuzz_seed_write(dir, "am-keep", &seed);

    /* A bundle of three short AMs opening the stream, then a bundle inside
     * a fragmented message */
    for (i = 0; i < 3; ++i) {
        bundle_rec.am_id  = i;
        bundle_rec.length = 8;
        memcpy(bundle + (i * (sizeof(bundle_rec) + 8)), &bundle_rec,
               sizeof(bundle_rec));
    }
    uct_usnic_fuzz_seed_dgram(&seed, R, UCT_USNIC_PKT_BUNDLE, single | open,
                              0, none, 1, bundle, sizeof(bundle), 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, UCT_USNIC_PKT_FLAG_FIRST, 1, 0, 2,
                              NULL, 100, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, UCT_USNIC_PKT_BUNDLE, single, 0, 0, 3,
                              bundle, sizeof(bundle), 0);
    uct_usnic_fuzz_seed_write(dir, "bundle", &seed);

    /* AM with a piggy-backed ACK for the target's ep to the other iface */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM,
                              single | open | UCT_USNIC_PKT_FLAG_ACK, 0, none,
                              1, NULL, 16, sent);
    uct_usnic_fuzz_seed_write(dir, "am-ack-trailer", &seed);

    /* Duplicate, gap (selective ACK sent back), beyond the window */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 0, none, 1, NULL,
                              8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 0, 1, NULL, 8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 0, 4, NULL, 8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 0, 6, NULL, 8, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 0, 5000, NULL, 8, 0);
    uct_usnic_fuzz_seed_write(dir, "am-dup-gap", &seed);

    /* Standalone ACKs to the target's ep, with and without SACK bits */
    uct_usnic_fuzz_seed_ack(&seed, R, sent, 0);
    uct_usnic_fuzz_seed_write(dir, "ack", &seed);
    uct_usnic_fuzz_seed_ack(&seed, S, sent - 2, 0x5);
    uct_usnic_fuzz_seed_write(dir, "ack-sack", &seed);
    uct_usnic_fuzz_seed_ack(&seed, R, sent + 1, 0);
    uct_usnic_fuzz_seed_write(dir, "ack-unsent", &seed);

    /* PUT with the live key inside the region, then outside it */
    uct_usnic_fuzz_seed_dgram(&seed, R, UCT_USNIC_PKT_PUT, single | open, 0,
                              none, 1, body, sizeof(put) + 64, 0);
    uct_usnic_fuzz_seed_write(dir, "put-live", &seed);
    put.address = UCT_USNIC_FUZZ_REGION_SIZE - 32;
    memcpy(body, &put, sizeof(put));
    uct_usnic_fuzz_seed_dgram(&seed, R, UCT_USNIC_PKT_PUT, single | open, 0,
                              none, 1, body, sizeof(put) + 64, 0);
    uct_usnic_fuzz_seed_write(dir, "put-range", &seed);
    put.address = 0;
    put.length  = 2000;
    put.offset  = 1400;
    memcpy(body, &put, sizeof(put));
    uct_usnic_fuzz_seed_dgram(&seed, S, UCT_USNIC_PKT_PUT, open, 0, none, 1,
                              body, sizeof(put) + 600, 0);
    uct_usnic_fuzz_seed_write(dir, "put-offset", &seed);

    /* PROBE, then an AM on the same stream */
    uct_usnic_fuzz_seed_dgram(&seed, R, UCT_USNIC_PKT_PROBE, open, 0, none, 1,
                              NULL, 0, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 0, 2, NULL, 4, 0);
    uct_usnic_fuzz_seed_write(dir, "probe", &seed);

    /* Invalid: short, bad version, bad type, bad AM id, stale, no stream */
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 0, none, 1, NULL,
                              4, 0);
    seed.length -= 30; /* cut into the header */
    seed.buf[1]  = 10;
    uct_usnic_fuzz_seed_write(dir, "bad-short", &seed);
    memset(&bad_hdr, 0, sizeof(bad_hdr));
    bad_hdr.version = UCT_USNIC_PROTO_VERSION + 1;
    bad_hdr.type    = AM;
    uct_usnic_fuzz_seed_raw(&seed, R, &bad_hdr, sizeof(bad_hdr));
    bad_hdr.version = UCT_USNIC_PROTO_VERSION;
    bad_hdr.type    = UCT_USNIC_PKT_LAST + 3;
    uct_usnic_fuzz_seed_raw(&seed, R, &bad_hdr, sizeof(bad_hdr));
    uct_usnic_fuzz_seed_raw(&seed, R | UCT_USNIC_FUZZ_SEL_PRIO, &bad_hdr,
                            sizeof(bad_hdr));
    uct_usnic_fuzz_seed_write(dir, "bad-version-type", &seed);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, UCT_AM_ID_MAX,
                              none, 1, NULL, 4, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, 7, 1, NULL, 4, 0);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single, 0, none, 1, NULL, 4, 0);
    uct_usnic_fuzz_seed_write(dir, "bad-am-id-stream", &seed);
    uct_usnic_fuzz_seed_dgram(&seed, R, AM, single | open, 0, none, 1, NULL,
                              4, 0);
    seed.buf[UCT_USNIC_FUZZ_REC_HDR + 4] = 0x77; /* stale incarnation */
    uct_usnic_fuzz_seed_write(dir, "bad-stale", &seed);
}


static void uct_usnic_fuzz_cleanup(void);

/* The MD of UCT_USNIC_FUZZ_DEV: MDs are named after the provider */
static void uct_usnic_fuzz_md_open(const uct_md_config_t *md_config)
{
    uct_component_attr_t attr = {0};
    uct_tl_resource_desc_t *tls;
    unsigned i, j, num_tls;
    ucs_status_t status;

    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    status          = uct_component_query(uct_usnic_fuzz.component, &attr);
    uct_usnic_fuzz_check_ok(status, "uct_component_query");
    attr.md_resources = calloc(attr.md_resource_count,
                               sizeof(*attr.md_resources));
    attr.field_mask   = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    status            = uct_component_query(uct_usnic_fuzz.component, &attr);
    uct_usnic_fuzz_check_ok(status, "uct_component_query");

    for (i = 0; i < attr.md_resource_count; ++i) {
        status = uct_md_open(uct_usnic_fuzz.component,
                             attr.md_resources[i].md_name, md_config,
                             &uct_usnic_fuzz.md);
        uct_usnic_fuzz_check_ok(status, "uct_md_open");
        status = uct_md_query_tl_resources(uct_usnic_fuzz.md, &tls, &num_tls);
        uct_usnic_fuzz_check_ok(status, "uct_md_query_tl_resources");
        for (j = 0; j < num_tls; ++j) {
            if (!strcmp(tls[j].dev_name, UCT_USNIC_FUZZ_DEV)) {
                break;
            }
        }
        uct_release_tl_resource_list(tls);
        if (j < num_tls) {
            free(attr.md_resources);
            return;
        }
        uct_md_close(uct_usnic_fuzz.md);
    }

    uct_usnic_fuzz_check(0, "no usnic memory domain has device "
                         UCT_USNIC_FUZZ_DEV);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *seed_dir = getenv("UCT_USNIC_FUZZ_WRITE_SEEDS");
    uct_component_attr_t comp_attr;
    uct_component_h *components;
    uct_md_config_t *md_config;
    unsigned num_components, i, found;
    uint8_t packed_rkey[sizeof(uct_usnic_rkey_t)];
    ucs_status_t status;

    if (seed_dir != NULL) {
        uct_usnic_fuzz_write_seeds(seed_dir);
        exit(0);
    }

    /* libFuzzer and ASan report crashes, not UCX's signal handlers */
    ucs_debug_disable_signals();

    /* This binary has the module built in: libuct_usnic.so would register
     * a second "usnic" component when libuct loads its modules */
    status = ucs_global_opts_set_value("MODULES", "^usnic");
    uct_usnic_fuzz_check_ok(status, "setting UCX_MODULES");

    status = uct_query_components(&components, &num_components);
    uct_usnic_fuzz_check_ok(status, "uct_query_components");
    for (i = 0, found = 0; i < num_components; ++i) {
        comp_attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        status               = uct_component_query(components[i],
                                                   &comp_attr);
        uct_usnic_fuzz_check_ok(status, "uct_component_query");
        if (!strcmp(comp_attr.name, "usnic")) {
            uct_usnic_fuzz.component = components[i];
            ++found;
        }
    }
    uct_release_component_list(components);
    uct_usnic_fuzz_check(found == 1, "%u usnic components registered", found);

    status = ucs_async_context_create(UCS_ASYNC_MODE_POLL,
                                      &uct_usnic_fuzz.async);
    uct_usnic_fuzz_check_ok(status, "ucs_async_context_create");
    status = uct_worker_create(uct_usnic_fuzz.async, UCS_THREAD_MODE_SINGLE,
                               &uct_usnic_fuzz.worker);
    uct_usnic_fuzz_check_ok(status, "uct_worker_create");

    status = uct_md_config_read(uct_usnic_fuzz.component, NULL, NULL,
                                &md_config);
    uct_usnic_fuzz_check_ok(status, "uct_md_config_read");
    uct_usnic_fuzz_md_open(md_config);
    uct_config_release(md_config);

    status = uct_md_iface_config_read(uct_usnic_fuzz.md, UCT_USNIC_TL_NAME,
                                      NULL, NULL,
                                      &uct_usnic_fuzz.iface_config);
    uct_usnic_fuzz_check_ok(status, "uct_md_iface_config_read");
    /* ACKs as soon as owed, not after a delay: runs do not depend on time */
    status = uct_config_modify(uct_usnic_fuzz.iface_config, "ACK_DELAY", "0");
    uct_usnic_fuzz_check_ok(status, "setting ACK_DELAY");

    /* Exactly the registered size: ASan sees a write past its end */
    uct_usnic_fuzz.region = calloc(1, UCT_USNIC_FUZZ_REGION_SIZE);
    uct_usnic_fuzz_check(uct_usnic_fuzz.region != NULL, "calloc failed");
    status = uct_md_mem_reg(uct_usnic_fuzz.md, uct_usnic_fuzz.region,
                            UCT_USNIC_FUZZ_REGION_SIZE,
                            UCT_MD_MEM_ACCESS_REMOTE_PUT,
                            &uct_usnic_fuzz.memh);
    uct_usnic_fuzz_check_ok(status, "uct_md_mem_reg");
    status = uct_md_mkey_pack(uct_usnic_fuzz.md, uct_usnic_fuzz.memh,
                              packed_rkey);
    uct_usnic_fuzz_check_ok(status, "uct_md_mkey_pack");
    memcpy(&uct_usnic_fuzz.rkey, packed_rkey, sizeof(uct_usnic_fuzz.rkey));
    status = uct_rkey_unpack(uct_usnic_fuzz.component, packed_rkey,
                             &uct_usnic_fuzz.rkey_bundle);
    uct_usnic_fuzz_check_ok(status, "uct_rkey_unpack");

    uct_usnic_fuzz_open_ifaces();
    /* After LeakSanitizer's own exit handler: runs before its check */
    atexit(uct_usnic_fuzz_cleanup);
    return 0;
}

/* libFuzzer exits with exit(): close everything, so that LeakSanitizer
 * reports only what the module lost */
static void uct_usnic_fuzz_cleanup(void)
{
    if (uct_usnic_fuzz.worker == NULL) {
        return;
    }

    uct_usnic_fuzz_close_ifaces();
    uct_rkey_release(uct_usnic_fuzz.component, &uct_usnic_fuzz.rkey_bundle);
    uct_md_mem_dereg(uct_usnic_fuzz.md, uct_usnic_fuzz.memh);
    free(uct_usnic_fuzz.region);
    uct_config_release(uct_usnic_fuzz.iface_config);
    uct_md_close(uct_usnic_fuzz.md);
    uct_worker_destroy(uct_usnic_fuzz.worker);
    ucs_async_context_destroy(uct_usnic_fuzz.async);
    uct_usnic_fuzz.worker = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uct_usnic_fuzz_iface_t *ifaces = uct_usnic_fuzz.ifaces;
    uct_usnic_fuzz_iface_t *target, *other;
    uct_usnic_channel_id_t channel_id;
    size_t offset, length;
    uint8_t sel;

    for (offset = 0; (offset + UCT_USNIC_FUZZ_REC_HDR) <= size;
         offset += length) {
        sel         = data[offset];
        length      = data[offset + 1] | ((size_t)data[offset + 2] << 8);
        offset     += UCT_USNIC_FUZZ_REC_HDR;
        length      = ucs_min(length, size - offset);
        target      = &ifaces[(sel & UCT_USNIC_FUZZ_SEL_SENDER) ?
                              UCT_USNIC_FUZZ_S : UCT_USNIC_FUZZ_R];
        other       = &ifaces[(sel & UCT_USNIC_FUZZ_SEL_SENDER) ?
                              UCT_USNIC_FUZZ_R : UCT_USNIC_FUZZ_S];
        channel_id  = (sel & UCT_USNIC_FUZZ_SEL_PRIO) ?
                      UCT_USNIC_CHANNEL_PRIO : UCT_USNIC_CHANNEL_DATA;

        uct_usnic_fuzz_deliver(target, other, channel_id, data + offset,
                               length);
        if (sel & UCT_USNIC_FUZZ_SEL_PROGRESS) {
            uct_usnic_fuzz_progress(1);
        }
    }

    /* ACKs, from progress and from the async timer (polled here); then the
     * other iface takes what they brought */
    uct_usnic_fuzz_progress(UCT_USNIC_FUZZ_PROGRESS);
    ucs_async_poll(uct_usnic_fuzz.async);
    uct_usnic_fuzz_progress(UCT_USNIC_FUZZ_PROGRESS);
    uct_usnic_fuzz_reset();

    if (++uct_usnic_fuzz.runs % UCT_USNIC_FUZZ_RESET_RUNS == 0) {
        uct_usnic_fuzz_close_ifaces();
        uct_usnic_fuzz_open_ifaces();
    }
    return 0;
}
