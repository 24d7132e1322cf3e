/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_TEST_H
#define UCT_USNIC_TEST_H

#include <common/test.h>
#include <uct/api/uct.h>
#include <uct/uct_test.h>

extern "C" {
#include <uct/usnic/usnic_ep.h>
#include <uct/usnic/usnic_iface.h>
#include <uct/usnic/usnic_proto.h>
#include <uct/usnic/usnic_tx.h>
}

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <functional>
#include <string>
#include <vector>


/* An iface's counter, by the name after UCT_USNIC_IFACE_STAT_ */
#define USNIC_COUNTER(_iface, _name) \
    ((_iface)->stats[UCT_USNIC_IFACE_STAT_##_name])

/* Datagrams an iface dropped for a reason: the name after
 * UCT_USNIC_RX_DROP_, or the value */
#define USNIC_DROPS(_iface, _name) \
    USNIC_DROPS_BY(_iface, UCT_USNIC_RX_DROP_##_name)
#define USNIC_DROPS_BY(_iface, _reason) \
    ((_iface)->stats[UCT_USNIC_IFACE_STAT_RX_DROP + (_reason)])


namespace usnic_test {

/* length bytes at buffer as 1 to max_iov entries of random sizes, some
 * possibly empty */
static inline std::vector<uct_iov_t>
random_iov(uint8_t *buffer, size_t length, size_t max_iov)
{
    std::vector<uct_iov_t> iov(1 + ucs::rand() % max_iov);
    size_t offset = 0;

    for (size_t i = 0; i < iov.size(); ++i) {
        iov[i].buffer = buffer + offset;
        iov[i].length = (i == (iov.size() - 1)) ?
                        (length - offset) :
                        ucs::rand() % (length - offset + 1);
        iov[i].memh   = UCT_MEM_HANDLE_NULL;
        iov[i].stride = 0;
        iov[i].count  = 1;
        offset       += iov[i].length;
    }

    return iov;
}

/* Set a variable in a configuration read with uct_md_config_read or
 * uct_md_iface_config_read: UCX 1.13 matches names relative to the
 * transport's table, 1.22 with the table's prefix */
static inline ucs_status_t
config_modify(void *config, const std::string &name, const std::string &value)
{
    ucs_status_t status = uct_config_modify(config, name.c_str(),
                                            value.c_str());

    return (status != UCS_ERR_NO_ELEM) ?
                   status :
                   uct_config_modify(config, ("USNIC_" + name).c_str(),
                                     value.c_str());
}

/* Whether the MD runs on the built-in kernel provider (named "kernel_N") */
static inline bool on_kernel_provider(const std::string &md_name)
{
    return md_name.rfind(UCT_USNIC_PROVIDER_KERNEL "_", 0) == 0;
}

static inline bool port_is_free(unsigned port)
{
    struct sockaddr_in addr = {};
    int fd                  = socket(AF_INET, SOCK_DGRAM, 0);
    bool is_free;

    addr.sin_family = AF_INET;
    addr.sin_port   = htons(port);
    is_free         = (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0);
    close(fd);
    return is_free;
}

/* Two consecutive UDP ports nobody has bound, for UCX_USNIC_PORT_RANGE */
static inline unsigned free_port_pair()
{
    unsigned port = 20000 + ucs::rand() % 40000;

    while (!port_is_free(port) || !port_is_free(port + 1)) {
        port += 2;
    }
    return port;
}

/* The header of a data packet, as a sender makes it */
static inline uct_usnic_hdr_t
data_hdr(uint8_t type, uint8_t flags, uint8_t am_id, uint32_t incarnation,
         uint32_t stream_id, uct_usnic_psn_t psn, uint64_t token)
{
    uct_usnic_hdr_t hdr;

    hdr.version     = UCT_USNIC_PROTO_VERSION;
    hdr.type        = type;
    hdr.flags       = flags;
    hdr.am_id       = am_id;
    hdr.incarnation = incarnation;
    hdr.stream_id   = stream_id;
    hdr.psn         = psn;
    hdr.token       = token;
    return hdr;
}

/* A standalone ACK of one stream as it travels */
struct ack_datagram {
    uct_usnic_hdr_t      hdr;
    uct_usnic_ack_body_t body;
    uct_usnic_ack_rec_t  rec;
} UCS_S_PACKED;

/* Hand the ep an ACK from its peer, as the peer would make it: up to psn,
 * with the selective-ACK bits given */
static inline void ack_ep(uct_usnic_ep_t *ep, uct_usnic_psn_t psn,
                          uint64_t sack = 0)
{
    uct_usnic_iface_t *iface = uct_usnic_ep_iface(ep);
    uct_usnic_ack_ext_t ack;

    ack.ep_id     = ep->id;
    ack.stream_id = ep->peer_stream_id;
    ack.psn       = psn;
    ack.token     = ep->token;
    uct_usnic_iface_enter(iface);
    uct_usnic_tx_handle_ack(iface, &ack, ep->peer_incarnation, sack, 0,
                            ucs_get_time());
    uct_usnic_iface_leave(iface);
}

/* Datagrams an iface has taken or dropped on receive */
static inline uint64_t rx_seen(const uct_usnic_iface_t *iface)
{
    uint64_t seen = USNIC_COUNTER(iface, RX_PACKETS) +
                    USNIC_COUNTER(iface, RX_ACKS);

    for (int reason = 0; reason < UCT_USNIC_RX_DROP_LAST; ++reason) {
        seen += USNIC_DROPS_BY(iface, reason);
    }
    for (int id = 0; id < UCT_USNIC_CHANNEL_LAST; ++id) {
        seen += iface->channels[id].rx_bad_seal;
    }
    return seen;
}

/* Send a raw UDP datagram to one channel of an iface, as a peer would:
 * sealed as the channel expects (unless told not to seal it) */
static inline void send_datagram(const uct_usnic_iface_t *iface,
                                 uct_usnic_channel_id_t id, const void *data,
                                 size_t length, bool seal = true)
{
    const uct_usnic_channel_t *channel = &iface->channels[id];
    struct sockaddr_in dest            = channel->addr;
    std::vector<uint8_t> dgram((const uint8_t*)data,
                               (const uint8_t*)data + length);
    int fd;

    if (seal) {
        dgram.resize(length + channel->seal.length);
        uct_usnic_seal_put(&channel->seal, dgram.data(), length);
    }

    fd = socket(AF_INET, SOCK_DGRAM, 0);
    ASSERT_GE(fd, 0);
    EXPECT_EQ((ssize_t)dgram.size(),
              sendto(fd, dgram.data(), dgram.size(), 0,
                     (struct sockaddr*)&dest, sizeof(dest)));
    close(fd);
}

} // namespace usnic_test


/* What every usnic fixture uses, as ib/ud_base.h is for ud */
class test_usnic_base : public uct_test {
protected:
    static uct_usnic_iface_t *usnic_iface(entity *e)
    {
        return ucs_derived_of(e->iface(), uct_usnic_iface_t);
    }

    bool on_kernel_provider() const
    {
        return usnic_test::on_kernel_provider(GetParam()->md_name);
    }

    /* For ifaces created from now on. UCX 1.13 names the variable relative
     * to the transport's table, 1.22 with the table's prefix: both are
     * set, whichever this UCX knows */
    void set_usnic_config(const std::string &name, const std::string &value)
    {
        modify_config(name, value, IGNORE_IF_NOT_EXIST);
        modify_config("USNIC_" + name, value, IGNORE_IF_NOT_EXIST);
    }

    /* Progress every entity (or only the one given) until done() holds or
     * the time is up; whether it holds */
    bool progress_until(const std::function<bool()> &done,
                        double seconds = 60, entity *only = NULL)
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(seconds);

        while (!done() && (ucs_get_time() < deadline)) {
            if (only != NULL) {
                only->progress();
            } else {
                progress();
            }
        }
        return done();
    }
};

#endif
