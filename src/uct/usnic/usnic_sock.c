/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_channel.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/sock.h>
#include <ucs/sys/string.h>

#include <rdma/fi_errno.h>
#include <arpa/inet.h>
#include <netinet/udp.h>
#include <net/if.h>
#include <sys/socket.h>
#include <ifaddrs.h>
#include <poll.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

/*
 * The kernel provider: each channel is a UDP socket. The cost of a datagram
 * is the system call that carries it, so every path carries many: a burst
 * of messages leaves in one sendmmsg, each message of several datagrams with
 * UDP segmentation offload (the kernel cuts it, or hands it whole to a local
 * receiver), receives take a batch per recvmmsg, and UDP_GRO hands back a
 * peer's burst as one buffer to split.
 */

#ifndef SOL_UDP
#  define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#  define UDP_SEGMENT 103 /* Linux 4.18 */
#endif
#ifndef UDP_GRO
#  define UDP_GRO 104     /* Linux 5.0 */
#endif

/* Most segments, and bytes, the kernel takes in one UDP_SEGMENT send */
#define UCT_USNIC_SOCK_GSO_MAX_SEGS  64
#define UCT_USNIC_SOCK_GSO_MAX_BYTES (65535 - 20 - 8)
/* Most messages, each cut by the kernel, in one sendmmsg */
#define UCT_USNIC_SOCK_GSO_MAX_RUNS  16

/* A coalesced receive holds up to one IP packet's worth of a peer's
 * datagrams */
#define UCT_USNIC_SOCK_GRO_SLOT_SIZE 65536
#define UCT_USNIC_SOCK_GRO_SLOTS     8
#define UCT_USNIC_SOCK_RX_SLOTS      32

/*
 * A channel whose polls found exactly one datagram, each time something
 * came, SINGLE_POLLS times in a row reads one datagram per recv(), which
 * needs UDP_GRO off: it is turned off halfway, so that a buffer the kernel
 * coalesced before it saw the change is still read with its segment size.
 * BATCH_POLLS polls in a row that find a datagram bring back batches.
 */
#define UCT_USNIC_SOCK_SINGLE_POLLS  16
#define UCT_USNIC_SOCK_BATCH_POLLS   4
#define UCT_USNIC_SOCK_GRO_OFF_POLLS (UCT_USNIC_SOCK_SINGLE_POLLS / 2)

/* Largest datagram offered: a jumbo frame's. Loopback stands in for a
 * network, with Ethernet's frames. */
#define UCT_USNIC_SOCK_MAX_MTU       9000
#define UCT_USNIC_SOCK_LOOPBACK_MTU  1500
#define UCT_USNIC_SOCK_IP_UDP_HDRS   28

/* Bytes of socket buffer a queued datagram costs beyond its payload */
#define UCT_USNIC_SOCK_SKB_OVERHEAD  512

/* Queue sizes reported for the checks of RX_QUEUE_LEN and TX_QUEUE_LEN */
#define UCT_USNIC_SOCK_QUEUE_MAX     65536


static ssize_t uct_usnic_sock_errno(void)
{
    /* A full socket buffer is a full send queue: try again later. So is a
     * connected socket's report that an earlier datagram found no socket
     * (the datagram at hand was not sent): the peer may be restarting, and
     * if it is gone its timeout says so. */
    return ((errno == EAGAIN) || (errno == EWOULDBLOCK) ||
            (errno == ENOBUFS) || (errno == EINTR) ||
            (errno == ECONNREFUSED)) ? -FI_EAGAIN : -errno;
}

/* Where datagrams to dest leave: the socket connected to it, or the
 * channel's, naming the address */
static UCS_F_ALWAYS_INLINE int
uct_usnic_sock_dest(const uct_usnic_channel_t *channel, fi_addr_t dest,
                    const struct sockaddr_in **name_p)
{
    ucs_assert(dest < channel->av->count);
    if (channel->av->fds[dest] >= 0) {
        *name_p = NULL;
        return channel->av->fds[dest];
    }

    *name_p = &channel->av->addrs[dest];
    return channel->sock.fd;
}

static UCS_F_ALWAYS_INLINE socklen_t
uct_usnic_sock_namelen(const struct sockaddr_in *name)
{
    return (name == NULL) ? 0 : sizeof(*name);
}

static ssize_t uct_usnic_sock_send(uct_usnic_channel_t *channel,
                                   const void *buffer, size_t length,
                                   fi_addr_t dest)
{
    const struct sockaddr_in *name;
    int fd;

    fd = uct_usnic_sock_dest(channel, dest, &name);
    if (ucs_likely(sendto(fd, buffer, length, MSG_DONTWAIT,
                          (const struct sockaddr*)name,
                          uct_usnic_sock_namelen(name)) >= 0)) {
        ++channel->sock.sends;
        return 0;
    }

    return uct_usnic_sock_errno();
}

/* How many datagrams from the first one the kernel can segment as one send:
 * all of the first one's size, but for a shorter last one; each grows by
 * seal_len bytes */
static unsigned uct_usnic_sock_gso_run(const uct_usnic_dgram_t *dgrams,
                                       unsigned count, size_t seal_len)
{
    size_t seg_size = dgrams[0].length;
    size_t total    = seg_size + seal_len;
    unsigned n;

    for (n = 1; n < ucs_min(count, UCT_USNIC_SOCK_GSO_MAX_SEGS); ++n) {
        if ((dgrams[n].length > seg_size) ||
            ((total + dgrams[n].length + seal_len) >
             UCT_USNIC_SOCK_GSO_MAX_BYTES)) {
            break;
        }

        total += dgrams[n].length + seal_len;
        if (dgrams[n].length < seg_size) {
            return n + 1;
        }
    }

    return n;
}

/*
 * Copy datagrams end to end into the channel's send buffer, sealing each
 * there. The kernel copies one long piece of memory far faster than the same
 * bytes in a header, user data and trailer per datagram, and the checksum
 * runs faster over one piece too. Returns the bytes written.
 */
static size_t uct_usnic_sock_stage(uct_usnic_channel_t *channel,
                                   const uct_usnic_dgram_t *dgrams,
                                   unsigned count, void *dst)
{
    size_t total = 0;
    void *dgram;
    unsigned i;

    for (i = 0; i < count; ++i) {
        dgram  = UCS_PTR_BYTE_OFFSET(dst, total);
        total += uct_usnic_channel_seal(channel, dgram,
                                        uct_usnic_dgram_gather(&dgrams[i],
                                                               dgram));
    }

    return total;
}

/* One system call for a burst: each run of equal datagrams is a message
 * that the kernel cuts every segment size bytes */
static unsigned uct_usnic_sock_send_gso(uct_usnic_channel_t *channel,
                                        const uct_usnic_dgram_t *dgrams,
                                        unsigned count, int fd,
                                        const struct sockaddr_in *name)
{
    char control[UCT_USNIC_SOCK_GSO_MAX_RUNS][CMSG_SPACE(sizeof(uint16_t))];
    struct iovec iov[UCT_USNIC_SOCK_GSO_MAX_RUNS];
    struct mmsghdr msgs[UCT_USNIC_SOCK_GSO_MAX_RUNS];
    unsigned runs[UCT_USNIC_SOCK_GSO_MAX_RUNS];
    void *stage = channel->sock.stage;
    unsigned n, i, d, sent;
    struct cmsghdr *cmsg;
    struct msghdr *msg;
    uint16_t seg_size;
    int ret;

    count = ucs_min(count, UCT_USNIC_CHANNEL_MAX_BURST);
    for (n = 0, d = 0; (d < count) && (n < UCT_USNIC_SOCK_GSO_MAX_RUNS);
         ++n) {
        runs[n]          = uct_usnic_sock_gso_run(&dgrams[d], count - d,
                                                  channel->seal.length);
        iov[n].iov_base  = stage;
        iov[n].iov_len   = uct_usnic_sock_stage(channel, &dgrams[d], runs[n],
                                                stage);
        stage            = UCS_PTR_BYTE_OFFSET(stage, iov[n].iov_len);
        msg              = &msgs[n].msg_hdr;
        memset(msg, 0, sizeof(*msg));
        msg->msg_name    = (void*)name;
        msg->msg_namelen = uct_usnic_sock_namelen(name);
        msg->msg_iov     = &iov[n];
        msg->msg_iovlen  = 1;

        if (runs[n] > 1) {
            seg_size            = dgrams[d].length + channel->seal.length;
            memset(control[n], 0, sizeof(control[n]));
            msg->msg_control    = control[n];
            msg->msg_controllen = sizeof(control[n]);
            cmsg                = CMSG_FIRSTHDR(msg);
            cmsg->cmsg_level    = SOL_UDP;
            cmsg->cmsg_type     = UDP_SEGMENT;
            cmsg->cmsg_len      = CMSG_LEN(sizeof(seg_size));
            memcpy(CMSG_DATA(cmsg), &seg_size, sizeof(seg_size));
        }
        d += runs[n];
    }

    ret = sendmmsg(fd, msgs, n, MSG_DONTWAIT);
    if (ret < 0) {
        if ((uct_usnic_sock_errno() != -FI_EAGAIN) && (runs[0] > 1)) {
            /* No offload on this path: one datagram per message instead */
            ucs_debug("%s: UDP_SEGMENT send failed (%s), sending without "
                      "segmentation offload from now on", channel->name,
                      strerror(errno));
            channel->sock.gso = 0;
        }
        return 0;
    }

    channel->sock.sends += ret;
    for (i = 0, sent = 0; i < ret; ++i) {
        sent += runs[i];
    }
    return sent;
}

static unsigned uct_usnic_sock_send_mmsg(uct_usnic_channel_t *channel,
                                         const uct_usnic_dgram_t *dgrams,
                                         unsigned count, int fd,
                                         const struct sockaddr_in *name)
{
    struct mmsghdr msgs[UCT_USNIC_CHANNEL_MAX_BURST];
    struct iovec iov[UCT_USNIC_CHANNEL_MAX_BURST];
    void *stage = channel->sock.stage;
    unsigned i;
    int ret;

    count = ucs_min(count, UCT_USNIC_CHANNEL_MAX_BURST);
    memset(msgs, 0, sizeof(*msgs) * count);
    for (i = 0; i < count; ++i) {
        iov[i].iov_base             = stage;
        iov[i].iov_len              = uct_usnic_sock_stage(channel,
                                                           &dgrams[i], 1,
                                                           stage);
        stage                       = UCS_PTR_BYTE_OFFSET(stage,
                                                          iov[i].iov_len);
        msgs[i].msg_hdr.msg_name    = (void*)name;
        msgs[i].msg_hdr.msg_namelen = uct_usnic_sock_namelen(name);
        msgs[i].msg_hdr.msg_iov     = &iov[i];
        msgs[i].msg_hdr.msg_iovlen  = 1;
    }

    ret = sendmmsg(fd, msgs, count, MSG_DONTWAIT);
    if (ret <= 0) {
        return 0;
    }

    channel->sock.sends += ret;
    return ret;
}

static unsigned uct_usnic_sock_send_burst(uct_usnic_channel_t *channel,
                                          uct_usnic_dgram_t *dgrams,
                                          unsigned count, fi_addr_t dest)
{
    unsigned sent = 0;
    const struct sockaddr_in *name;
    unsigned ret;
    int fd;

    fd = uct_usnic_sock_dest(channel, dest, &name);
    while (sent < count) {
        if (channel->sock.gso) {
            ret = uct_usnic_sock_send_gso(channel, &dgrams[sent],
                                          count - sent, fd, name);
            if ((ret == 0) && !channel->sock.gso) {
                continue; /* Again without offload */
            }
        } else {
            ret = uct_usnic_sock_send_mmsg(channel, &dgrams[sent],
                                           count - sent, fd, name);
        }

        sent += ret;
        if (ret == 0) {
            break;
        }
    }

    return sent;
}

/* Segment size of a coalesced receive, or 0 for a single datagram */
static size_t uct_usnic_sock_gro_size(const struct msghdr *msg)
{
    struct cmsghdr *cmsg;
    int seg_size;

    for (cmsg = CMSG_FIRSTHDR(msg); cmsg != NULL;
         cmsg = CMSG_NXTHDR((struct msghdr*)msg, cmsg)) {
        if ((cmsg->cmsg_level == SOL_UDP) && (cmsg->cmsg_type == UDP_GRO)) {
            memcpy(&seg_size, CMSG_DATA(cmsg), sizeof(seg_size));
            return (seg_size > 0) ? seg_size : 0;
        }
    }

    return 0;
}

/* Hand every datagram of one received buffer to the user; returns how many */
static unsigned uct_usnic_sock_rx_slot(uct_usnic_channel_t *channel,
                                       unsigned index)
{
    struct mmsghdr *mmsg = &channel->sock.msgs[index];
    const void *buffer   = channel->sock.iovs[index].iov_base;
    size_t length        = mmsg->msg_len;
    size_t seg_size      = uct_usnic_sock_gro_size(&mmsg->msg_hdr);
    unsigned count       = 0;
    uct_usnic_rx_desc_t *desc;
    size_t offset, seg_len;

    if (ucs_unlikely(mmsg->msg_hdr.msg_flags & MSG_TRUNC)) {
        /* Larger than any datagram the protocol sends */
        ucs_debug("%s: dropped a truncated datagram", channel->name);
        ++channel->rx_oversized;
        seg_size = 0;
        length   = 0;
    }

    if (seg_size == 0) {
        seg_size = length;
    }

    for (offset = 0; offset < length; offset += seg_size) {
        seg_len = ucs_min(seg_size, length - offset);
        ++count;
        if (ucs_unlikely(seg_len > channel->max_msg_size)) {
            ++channel->rx_oversized;
            continue;
        }

        desc = ucs_mpool_get_inline(&channel->rx_mp);
        if (ucs_unlikely(desc == NULL)) {
            continue; /* Lost; the sender resends it */
        }

        memcpy(uct_usnic_rx_desc_data(channel, desc),
               UCS_PTR_BYTE_OFFSET(buffer, offset), seg_len);
        uct_usnic_channel_rx_deliver(channel, desc, seg_len);
    }

    /* The kernel wrote these: ready the slot for the next call */
    mmsg->msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int));
    mmsg->msg_hdr.msg_flags      = 0;
    return count;
}

static void uct_usnic_sock_rx_error(uct_usnic_channel_t *channel,
                                    const char *call)
{
    if ((errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
        ucs_error("%s: %s failed: %m", channel->name, call);
    }
}

/* Turn UDP_GRO on or off where the channel coalesces */
static void uct_usnic_sock_set_gro(uct_usnic_channel_t *channel, int on)
{
    if (!channel->sock.gro || (channel->sock.gro_on == on)) {
        return;
    }

    if (setsockopt(channel->sock.fd, SOL_UDP, UDP_GRO, &on, sizeof(on)) != 0) {
        ucs_debug("%s: cannot set UDP_GRO to %d: %m", channel->name, on);
        return;
    }

    channel->sock.gro_on = on;
}

static void uct_usnic_sock_set_single(uct_usnic_channel_t *channel,
                                      int single)
{
    ucs_trace("%s: reading %s", channel->name,
              single ? "one datagram per recv" : "batches");
    channel->sock.single = single;
    channel->sock.streak = 0;
    if (!single) {
        uct_usnic_sock_set_gro(channel, 1);
    }
}

static unsigned uct_usnic_sock_progress_batch(uct_usnic_channel_t *channel,
                                              unsigned max_events)
{
    unsigned count = 0;
    unsigned want, i;
    int ret;

    do {
        want = ucs_min(channel->sock.num_slots, max_events - count);
        ret  = recvmmsg(channel->sock.fd, channel->sock.msgs, want,
                        MSG_DONTWAIT, NULL);
        if (ret <= 0) {
            if (ret < 0) {
                uct_usnic_sock_rx_error(channel, "recvmmsg");
            }
            break;
        }

        for (i = 0; i < ret; ++i) {
            count += uct_usnic_sock_rx_slot(channel, i);
        }
        /* Fewer than asked for: the socket is empty */
    } while ((ret == want) && (count < max_events));

    if (count > 1) {
        channel->sock.streak = 0;
        uct_usnic_sock_set_gro(channel, 1);
    } else if ((count == 1) &&
               (++channel->sock.streak >= UCT_USNIC_SOCK_GRO_OFF_POLLS)) {
        /* An empty poll says nothing of how datagrams come */
        uct_usnic_sock_set_gro(channel, 0);
        if ((channel->sock.streak >= UCT_USNIC_SOCK_SINGLE_POLLS) &&
            !channel->sock.gro_on) {
            uct_usnic_sock_set_single(channel, 1);
        }
    }

    return count;
}

/* recv() costs a third less than recvmsg() or recvmmsg(), which a poll that
 * mostly finds nothing pays in full (the latency of a ping-pong). The
 * datagram lands in the descriptor the user gets: no copy, and the next
 * descriptor is taken after the user answered, not before. */
static unsigned uct_usnic_sock_progress_single(uct_usnic_channel_t *channel)
{
    uct_usnic_rx_desc_t *desc = channel->sock.rx_desc;
    ssize_t ret;

    if (desc == NULL) {
        desc = ucs_mpool_get_inline(&channel->rx_mp);
        if (ucs_unlikely(desc == NULL)) {
            return 0; /* The socket keeps the datagrams meanwhile */
        }
        channel->sock.rx_desc = desc;
    }

    ret = recv(channel->sock.fd, uct_usnic_rx_desc_data(channel, desc),
               channel->max_msg_size, MSG_DONTWAIT | MSG_TRUNC);
    if (ret <= 0) {
        if (ret < 0) {
            uct_usnic_sock_rx_error(channel, "recv");
            channel->sock.streak = 0;
        }
        return 0;
    }

    if (++channel->sock.streak >= UCT_USNIC_SOCK_BATCH_POLLS) {
        /* They come faster than polls */
        uct_usnic_sock_set_single(channel, 0);
    }

    if (ucs_unlikely((size_t)ret > channel->max_msg_size)) {
        ucs_debug("%s: dropped an oversized datagram", channel->name);
        ++channel->rx_oversized;
        return 0;
    }

    channel->sock.rx_desc = NULL;
    uct_usnic_channel_rx_deliver(channel, desc, ret);
    return 1;
}

static unsigned uct_usnic_sock_progress(uct_usnic_channel_t *channel,
                                        unsigned max_events)
{
    if (channel->sock.single) {
        return uct_usnic_sock_progress_single(channel);
    }

    return uct_usnic_sock_progress_batch(channel, max_events);
}

static int uct_usnic_sock_may_wait(uct_usnic_channel_t *channel)
{
    struct pollfd pfd = {
        .fd     = channel->sock.fd,
        .events = POLLIN
    };

    return poll(&pfd, 1, 0) == 0;
}

static void uct_usnic_sock_free_slots(uct_usnic_channel_t *channel)
{
    ucs_free(channel->sock.stage);
    ucs_free(channel->sock.cmsgs);
    ucs_free(channel->sock.iovs);
    ucs_free(channel->sock.msgs);
    ucs_free(channel->sock.slots);
}

static void uct_usnic_sock_cleanup(uct_usnic_channel_t *channel)
{
    if (channel->sock.rx_desc != NULL) {
        ucs_mpool_put_inline(channel->sock.rx_desc);
    }
    uct_usnic_sock_free_slots(channel);
    close(channel->sock.fd);
}

const uct_usnic_channel_ops_t uct_usnic_sock_ops = {
    .send       = uct_usnic_sock_send,
    .send_burst = uct_usnic_sock_send_burst,
    .progress   = uct_usnic_sock_progress,
    .may_wait   = uct_usnic_sock_may_wait,
    .cleanup    = uct_usnic_sock_cleanup
};

static ucs_status_t uct_usnic_sock_alloc_slots(uct_usnic_channel_t *channel)
{
    size_t cmsg_size = CMSG_SPACE(sizeof(int));
    unsigned i;

    channel->sock.slots = ucs_malloc(channel->sock.num_slots *
                                     channel->sock.slot_size,
                                     "usnic_sock_slots");
    channel->sock.msgs  = ucs_calloc(channel->sock.num_slots,
                                     sizeof(*channel->sock.msgs),
                                     "usnic_sock_msgs");
    channel->sock.iovs  = ucs_calloc(channel->sock.num_slots,
                                     sizeof(*channel->sock.iovs),
                                     "usnic_sock_iovs");
    channel->sock.cmsgs = ucs_calloc(channel->sock.num_slots, cmsg_size,
                                     "usnic_sock_cmsgs");
    channel->sock.stage = ucs_malloc(UCT_USNIC_CHANNEL_MAX_BURST *
                                     (channel->prefix_size +
                                      channel->max_msg_size),
                                     "usnic_sock_stage");
    if ((channel->sock.slots == NULL) || (channel->sock.msgs == NULL) ||
        (channel->sock.iovs == NULL) || (channel->sock.cmsgs == NULL) ||
        (channel->sock.stage == NULL)) {
        ucs_error("%s: failed to allocate %u receive buffers of %zu bytes "
                  "and a send buffer of %u datagrams", channel->name,
                  channel->sock.num_slots, channel->sock.slot_size,
                  UCT_USNIC_CHANNEL_MAX_BURST);
        uct_usnic_sock_free_slots(channel);
        return UCS_ERR_NO_MEMORY;
    }

    for (i = 0; i < channel->sock.num_slots; ++i) {
        channel->sock.iovs[i].iov_base = UCS_PTR_BYTE_OFFSET(
                channel->sock.slots, i * channel->sock.slot_size);
        channel->sock.iovs[i].iov_len  = channel->sock.slot_size;
        channel->sock.msgs[i].msg_hdr.msg_iov        = &channel->sock.iovs[i];
        channel->sock.msgs[i].msg_hdr.msg_iovlen     = 1;
        channel->sock.msgs[i].msg_hdr.msg_control    =
                UCS_PTR_BYTE_OFFSET(channel->sock.cmsgs, i * cmsg_size);
        channel->sock.msgs[i].msg_hdr.msg_controllen = cmsg_size;
    }

    return UCS_OK;
}

/* Size a socket buffer; as root beyond the system's limit */
static void uct_usnic_sock_set_buf(int fd, const char *name, int opt,
                                   int force_opt, int size)
{
    if ((setsockopt(fd, SOL_SOCKET, force_opt, &size, sizeof(size)) != 0) &&
        (setsockopt(fd, SOL_SOCKET, opt, &size, sizeof(size)) != 0)) {
        ucs_debug("%s: cannot set socket buffer option %d to %d: %m", name,
                  opt, size);
    }
}

int uct_usnic_sock_buf_size(unsigned queue_len, size_t max_msg_size)
{
    return ucs_min(queue_len * (max_msg_size + UCT_USNIC_SOCK_SKB_OVERHEAD),
                   INT_MAX / 2);
}

int uct_usnic_sock_connect(const struct sockaddr_in *src,
                           const struct sockaddr_in *dst, int sndbuf)
{
    char str[UCS_SOCKADDR_STRING_LEN];
    int fd;

    ucs_sockaddr_str((const struct sockaddr*)dst, str, sizeof(str));
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if ((fd >= 0) &&
        (bind(fd, (const struct sockaddr*)src, sizeof(*src)) == 0) &&
        (connect(fd, (const struct sockaddr*)dst, sizeof(*dst)) == 0)) {
        uct_usnic_sock_set_buf(fd, str, SO_SNDBUF, SO_SNDBUFFORCE, sndbuf);
        return fd;
    }

    ucs_debug("usnic: no socket connected to %s: %m", str);
    if (fd >= 0) {
        close(fd);
    }
    return -1;
}

/* Bind to the first free port of the range, or to any with 0-0 */
static ucs_status_t uct_usnic_sock_bind(uct_usnic_channel_t *channel,
                                        const struct sockaddr_in *src,
                                        const ucs_range_spec_t *ports)
{
    struct sockaddr_in addr = *src;
    unsigned port;

    for (port = ports->first; port <= ports->last; ++port) {
        addr.sin_port = htons(port);
        if (bind(channel->sock.fd, (struct sockaddr*)&addr,
                 sizeof(addr)) == 0) {
            return UCS_OK;
        } else if ((errno != EADDRINUSE) || (ports->first == 0)) {
            break;
        }
    }

    if (ports->first == 0) {
        ucs_error("%s: bind(%s) failed: %m", channel->name,
                  inet_ntoa(addr.sin_addr));
    } else if (errno == EADDRINUSE) {
        ucs_error("%s: no free port in %sUSNIC_PORT_RANGE=%u-%u",
                  channel->name, UCS_DEFAULT_ENV_PREFIX, ports->first,
                  ports->last);
    } else {
        ucs_error("%s: bind to port %u of %sUSNIC_PORT_RANGE failed: %m",
                  channel->name, port, UCS_DEFAULT_ENV_PREFIX);
    }
    return UCS_ERR_IO_ERROR;
}

ucs_status_t uct_usnic_sock_open(uct_usnic_channel_t *channel,
                                 const struct fi_info *info,
                                 const uct_usnic_channel_params_t *params)
{
    socklen_t addrlen = sizeof(channel->addr);
    int one           = 1;
    ucs_status_t status;

    channel->sock.fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK |
                                       SOCK_CLOEXEC, 0);
    if (channel->sock.fd < 0) {
        ucs_error("%s: socket(AF_INET, SOCK_DGRAM) failed: %m",
                  channel->name);
        return UCS_ERR_IO_ERROR;
    }

    status = uct_usnic_sock_bind(channel, info->src_addr, params->port_range);
    if (status != UCS_OK) {
        goto err_close;
    }

    if ((getsockname(channel->sock.fd, (struct sockaddr*)&channel->addr,
                     &addrlen) != 0) ||
        (addrlen != sizeof(channel->addr))) {
        ucs_error("%s: getsockname failed: %m", channel->name);
        status = UCS_ERR_IO_ERROR;
        goto err_close;
    }

    uct_usnic_sock_set_buf(channel->sock.fd, channel->name, SO_RCVBUF,
                           SO_RCVBUFFORCE,
                           uct_usnic_sock_buf_size(params->rx_queue_len,
                                                   channel->max_msg_size));
    uct_usnic_sock_set_buf(channel->sock.fd, channel->name, SO_SNDBUF,
                           SO_SNDBUFFORCE,
                           uct_usnic_sock_buf_size(params->tx_queue_len,
                                                   channel->max_msg_size));

    channel->sock.gso          = 1; /* Until a send says otherwise */
    channel->sock.sends        = 0;
    channel->sock.gro          = params->coalesce &&
                                 (setsockopt(channel->sock.fd, SOL_UDP,
                                             UDP_GRO, &one,
                                             sizeof(one)) == 0);
    channel->sock.gro_on       = channel->sock.gro;
    channel->sock.single       = 0;
    channel->sock.streak       = 0;
    channel->sock.rx_desc      = NULL;
    if (channel->sock.gro) {
        channel->sock.num_slots = UCT_USNIC_SOCK_GRO_SLOTS;
        channel->sock.slot_size = UCT_USNIC_SOCK_GRO_SLOT_SIZE;
    } else {
        channel->sock.num_slots = UCT_USNIC_SOCK_RX_SLOTS;
        /* One byte more than a datagram may have, to see oversized ones */
        channel->sock.slot_size = channel->max_msg_size + 1;
    }

    status = uct_usnic_sock_alloc_slots(channel);
    if (status != UCS_OK) {
        goto err_close;
    }

    channel->wait_fd = params->wakeup ? channel->sock.fd : -1;
    return UCS_OK;

err_close:
    close(channel->sock.fd);
    return status;
}

/* Describe an IPv4 interface as libfabric would describe a domain */
static struct fi_info *uct_usnic_sock_ifinfo(const struct ifaddrs *ifa)
{
    struct sockaddr_in *src;
    struct fi_info *info;
    long mtu;

    if (ifa->ifa_flags & IFF_LOOPBACK) {
        mtu = UCT_USNIC_SOCK_LOOPBACK_MTU;
    } else if (ucs_read_file_number(&mtu, 1, "/sys/class/net/%s/mtu",
                                    ifa->ifa_name) != UCS_OK) {
        mtu = 1500;
    }

    info = fi_allocinfo();
    if (info == NULL) {
        return NULL;
    }

    src                           = calloc(1, sizeof(*src));
    info->fabric_attr->prov_name  = strdup(UCT_USNIC_PROVIDER_KERNEL);
    info->fabric_attr->name       = strdup(UCT_USNIC_PROVIDER_KERNEL);
    info->domain_attr->name       = strdup(ifa->ifa_name);
    if ((src == NULL) || (info->fabric_attr->prov_name == NULL) ||
        (info->fabric_attr->name == NULL) ||
        (info->domain_attr->name == NULL)) {
        free(src);
        fi_freeinfo(info);
        return NULL;
    }

    *src                          = *(struct sockaddr_in*)ifa->ifa_addr;
    src->sin_port                 = 0;
    info->src_addr                = src;
    info->src_addrlen             = sizeof(*src);
    info->addr_format             = FI_SOCKADDR_IN;
    info->caps                    = FI_MSG;
    info->mode                    = 0;
    info->ep_attr->type           = FI_EP_DGRAM;
    info->ep_attr->max_msg_size   = ucs_min(mtu, UCT_USNIC_SOCK_MAX_MTU) -
                                    UCT_USNIC_SOCK_IP_UDP_HDRS;
    info->tx_attr->inject_size    = info->ep_attr->max_msg_size;
    info->tx_attr->size           = UCT_USNIC_SOCK_QUEUE_MAX;
    info->rx_attr->size           = UCT_USNIC_SOCK_QUEUE_MAX;
    info->domain_attr->mr_mode    = 0;
    return info;
}

ucs_status_t uct_usnic_sock_getinfo(const char *domain_name,
                                    struct fi_info **info_p)
{
    struct fi_info *list = NULL, **tail = &list, *info;
    struct ifaddrs *ifaddrs, *ifa;

    if (getifaddrs(&ifaddrs) != 0) {
        ucs_error("getifaddrs() failed: %m");
        return UCS_ERR_IO_ERROR;
    }

    for (ifa = ifaddrs; ifa != NULL; ifa = ifa->ifa_next) {
        if ((ifa->ifa_addr == NULL) || (ifa->ifa_addr->sa_family != AF_INET) ||
            !(ifa->ifa_flags & IFF_UP) ||
            ((domain_name != NULL) && strcmp(ifa->ifa_name, domain_name))) {
            continue;
        }

        for (info = list; info != NULL; info = info->next) {
            if (!strcmp(info->domain_attr->name, ifa->ifa_name)) {
                break; /* One domain per interface, its first address */
            }
        }
        if (info != NULL) {
            continue;
        }

        *tail = uct_usnic_sock_ifinfo(ifa);
        if (*tail == NULL) {
            ucs_error("failed to describe interface %s", ifa->ifa_name);
            break;
        }
        tail = &(*tail)->next;
    }

    freeifaddrs(ifaddrs);
    if (ifa != NULL) {
        fi_freeinfo(list);
        return UCS_ERR_NO_MEMORY;
    }

    *info_p = list;
    return (list == NULL) ? UCS_ERR_NO_DEVICE : UCS_OK;
}
