/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#include <common/test.h>
#include <uct/uct_test.h>
#include "usnic_test.h"

extern "C" {
#include <uct/usnic/usnic_ep.h>
}

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <list>
#include <map>
#include <string>
#include <vector>


/*
 * Remote writes: what the key grants arrives intact and in order; anything
 * else writes no byte, is counted and reported, and leaves the sender fine.
 */
class test_usnic_put : public test_usnic_base {
protected:
    static const size_t  GUARD_SIZE = 4096;
    static const size_t  REGION_SIZE = 64 * 1024;
    static const uint8_t GUARD_BYTE  = 0xa5;

    struct put_args {
        const uint8_t *data;
        size_t        length;
    };

    void init()
    {
        uct_test::init();
        create_entities();
    }

    /* The receiver with at most receiver_tx_bufs send buffers, if given */
    void create_entities(const char *receiver_tx_bufs = nullptr)
    {
        if (receiver_tx_bufs != nullptr) {
            set_usnic_config("TX_MAX_BUFS", receiver_tx_bufs);
        }
        m_receiver = create_entity(0);
        m_entities.push_back(m_receiver);
        if (receiver_tx_bufs != nullptr) {
            set_usnic_config("TX_MAX_BUFS", "-1");
        }
        m_sender = create_entity(0);
        m_entities.push_back(m_sender);
        m_sender->connect(0, *m_receiver, 0);

        /* The registered region sits between two guards */
        m_arena.assign(GUARD_SIZE + REGION_SIZE + GUARD_SIZE, GUARD_BYTE);
        m_expected = m_arena;
        m_memh     = register_region(UCT_MD_MEM_ACCESS_ALL, &m_rkey);
    }

    void cleanup()
    {
        if (m_memh != NULL) {
            release_region(m_memh, &m_rkey);
        }
        uct_test::cleanup();
    }

    uint8_t *region()
    {
        return &m_arena[GUARD_SIZE];
    }

    uint64_t region_addr(size_t offset = 0)
    {
        return (uintptr_t)(region() + offset);
    }

    uct_mem_h register_region(unsigned flags, uct_rkey_bundle_t *rkey)
    {
        uct_md_attr_t md_attr;
        uct_mem_h memh;

        EXPECT_UCS_OK(uct_md_query(m_receiver->md(), &md_attr));
        EXPECT_EQ(sizeof(uct_usnic_rkey_t), md_attr.rkey_packed_size);
        std::vector<uint8_t> packed(md_attr.rkey_packed_size);

        EXPECT_UCS_OK(uct_md_mem_reg(m_receiver->md(), region(), REGION_SIZE,
                                     flags, &memh));
        EXPECT_UCS_OK(uct_md_mkey_pack(m_receiver->md(), memh, &packed[0]));
        EXPECT_UCS_OK(uct_rkey_unpack(GetParam()->component, &packed[0],
                                      rkey));
        return memh;
    }

    void release_region(uct_mem_h memh, uct_rkey_bundle_t *rkey)
    {
        EXPECT_UCS_OK(uct_rkey_release(GetParam()->component, rkey));
        EXPECT_UCS_OK(uct_md_mem_dereg(m_receiver->md(), memh));
    }

    uct_usnic_iface_t *receiver_iface()
    {
        return ucs_derived_of(m_receiver->iface(), uct_usnic_iface_t);
    }

    uint64_t drops(uct_usnic_rx_drop_t reason)
    {
        return USNIC_DROPS_BY(receiver_iface(), reason);
    }

    size_t put_max_bcopy() const
    {
        return m_sender->iface_attr().cap.put.max_bcopy;
    }

    static size_t pack(void *dest, void *arg)
    {
        const put_args *args = (const put_args*)arg;

        memcpy(dest, args->data, args->length);
        return args->length;
    }

    /* A put_zcopy in flight: its memory lives until it completes */
    struct zcopy_put : uct_completion_t {
        unsigned             calls;
        std::vector<uint8_t> data;
    };

    static void zcopy_done(uct_completion_t *self)
    {
        ++static_cast<zcopy_put*>(self)->calls;
        EXPECT_UCS_OK(self->status);
    }

    /* The write from up to 4 iov entries of random sizes */
    void put_zcopy(uint64_t address, uct_rkey_t rkey, const uint8_t *data,
                   size_t length)
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
        ucs_status_t status;

        m_zcopy_puts.emplace_back();
        zcopy_put &zput = m_zcopy_puts.back();
        zput.func       = zcopy_done;
        zput.count      = 1;
        zput.status     = UCS_OK;
        zput.calls      = 0;
        zput.data.assign(data, data + length);
        std::vector<uct_iov_t> iov = usnic_test::random_iov(
                zput.data.data(), length,
                m_sender->iface_attr().cap.put.max_iov);

        do {
            status = uct_ep_put_zcopy(m_sender->ep(0), &iov[0], iov.size(),
                                      address, rkey, &zput);
            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((status == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));

        ASSERT_EQ(UCS_INPROGRESS, status);
    }

    void put(uint64_t address, uct_rkey_t rkey, const uint8_t *data,
             size_t length)
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
        put_args args       = {data, length};
        ssize_t packed;

        if (m_zcopy) {
            put_zcopy(address, rkey, data, length);
            return;
        }

        do {
            packed = uct_ep_put_bcopy(m_sender->ep(0), pack, &args, address,
                                      rkey);
            if (packed == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((packed == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));

        ASSERT_EQ((ssize_t)length, packed);
    }

    /* A write the target must apply: the expected image follows it */
    void put_ok(size_t offset, const uint8_t *data, size_t length)
    {
        put(region_addr(offset), m_rkey.rkey, data, length);
        memcpy(&m_expected[GUARD_SIZE + offset], data, length);
    }

    /* Completion of the flush means the writes are in place */
    void flush_sender()
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
        ucs_status_t status;

        do {
            progress();
            status = uct_ep_flush(m_sender->ep(0), 0, NULL);
        } while ((status == UCS_ERR_NO_RESOURCE || status == UCS_INPROGRESS) &&
                 (ucs_get_time() < deadline));
        ASSERT_UCS_OK(status);

        /* Each put_zcopy completed exactly once, before the flush */
        for (const zcopy_put &zput : m_zcopy_puts) {
            EXPECT_EQ(1u, zput.calls);
            EXPECT_EQ(0, zput.count);
        }
        m_zcopy_puts.clear();
    }

    void check_arena()
    {
        for (size_t i = 0; i < m_arena.size(); ++i) {
            if (m_arena[i] != m_expected[i]) {
                ADD_FAILURE() << "byte " << (ssize_t)(i - GUARD_SIZE)
                              << " of the region is 0x" << std::hex
                              << (int)m_arena[i] << ", expected 0x"
                              << (int)m_expected[i];
                return;
            }
        }
    }

    static std::vector<uint8_t> pattern(size_t length, unsigned seed)
    {
        std::vector<uint8_t> data(length);

        for (size_t i = 0; i < length; ++i) {
            data[i] = (uint8_t)(seed * 31 + i * 7 + (i >> 8));
        }
        return data;
    }

    /*
     * A write that must be refused: nothing lands, the reason is counted,
     * one warning names the peer, and the sender goes on as before.
     */
    void check_refused(uint64_t address, uct_rkey_t rkey, size_t length,
                       uct_usnic_rx_drop_t reason)
    {
        std::vector<uint8_t> data = pattern(length, 99);
        uint64_t before           = drops(reason);
        size_t datagrams          = ucs_div_round_up(
                length, receiver_iface()->config.put_max_payload);

        m_warnings.clear();
        {
            scoped_log_handler slh(wrap_warns_logger);
            put(address, rkey, &data[0], length);
            flush_sender();
        }

        EXPECT_EQ(before + datagrams, drops(reason));
        ASSERT_EQ(1u, m_warnings.size());
        EXPECT_NE(std::string::npos,
                  m_warnings[0].find("refused a remote write from 127.0.0.1"))
                << m_warnings[0];
        check_arena();

        /* The ep still works */
        if (m_memh != NULL) {
            std::vector<uint8_t> good = pattern(100, reason);
            put_ok(0, &good[0], good.size());
            flush_sender();
            check_arena();
        }

        /* A refused write is reported at most once a second */
        receiver_iface()->put_refused_logged = 0;
    }

    /* The largest read of either kind */
    size_t get_max() const
    {
        return m_sender->iface_attr().cap.get.max_bcopy;
    }

    static void unpack(void *arg, const void *data, size_t length)
    {
        std::vector<uint8_t> *dest = (std::vector<uint8_t>*)arg;

        dest->assign((const uint8_t*)data, (const uint8_t*)data + length);
    }

    /* Read from the target and wait for the data; the status of the read */
    ucs_status_t get(uint64_t address, uct_rkey_t rkey, size_t length,
                     bool zcopy, std::vector<uint8_t> &data)
    {
        ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
        uct_completion_t comp;
        ucs_status_t status;
        uct_iov_t iov[2];

        comp.func   = comp_cb;
        comp.count  = 1;
        comp.status = UCS_OK;
        data.assign(length, 0);
        /* Two iov entries, to see the data scattered across them */
        iov[0].buffer = &data[0];
        iov[0].length = length / 3;
        iov[0].memh   = UCT_MEM_HANDLE_NULL;
        iov[0].stride = 0;
        iov[0].count  = 1;
        iov[1]        = iov[0];
        iov[1].buffer = &data[length / 3];
        iov[1].length = length - length / 3;
        do {
            status = zcopy ? uct_ep_get_zcopy(m_sender->ep(0), iov, 2, address,
                                              rkey, &comp) :
                             uct_ep_get_bcopy(m_sender->ep(0), unpack, &data,
                                              length, address, rkey, &comp);
            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((status == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));

        if (status != UCS_INPROGRESS) {
            return status;
        }

        while ((comp.count > 0) && (ucs_get_time() < deadline)) {
            progress();
        }
        EXPECT_EQ(0, comp.count) << "read not completed";
        return comp.status;
    }

    static void comp_cb(uct_completion_t *self)
    {
    }

    /* Reads of random ranges after random writes on the same ep: each read
     * returns the region as the writes before it left it */
    void random_puts_gets(size_t count)
    {
        size_t max_len = ucs_min(ucs_min(put_max_bcopy(), get_max()),
                                 REGION_SIZE);
        std::vector<uint8_t> data;

        for (size_t i = 0; i < count; ++i) {
            size_t length = ucs::rand() %
                            (ucs_min(max_len, 1ul << (i % 17)) + 1);
            size_t offset = ucs::rand() % (REGION_SIZE - length + 1);

            data = pattern(length, i);
            put_ok(offset, &data[0], length);

            length = 1 + ucs::rand() % max_len;
            offset = ucs::rand() % (REGION_SIZE - length + 1);
            ASSERT_UCS_OK(get(region_addr(offset), m_rkey.rkey, length,
                              i & 1, data));
            ASSERT_TRUE(std::equal(data.begin(), data.end(),
                                   &m_expected[GUARD_SIZE + offset]))
                    << "read " << i << " of " << length << " bytes at "
                    << offset;
        }

        check_arena();
        for (int reason = UCT_USNIC_RX_DROP_PUT_KEY;
             reason <= UCT_USNIC_RX_DROP_GET_RANGE; ++reason) {
            EXPECT_EQ(0u, drops((uct_usnic_rx_drop_t)reason));
        }
    }

    /* A read the key does not allow fails, and the ep goes on */
    void check_get_refused(uint64_t address, uct_rkey_t rkey, size_t length,
                           uct_usnic_rx_drop_t reason)
    {
        uint64_t before = drops(reason);
        std::vector<uint8_t> data;

        m_warnings.clear();
        {
            scoped_log_handler slh(wrap_warns_logger);
            EXPECT_EQ(UCS_ERR_INVALID_ADDR,
                      get(address, rkey, length, true, data));
        }
        EXPECT_EQ(before + 1, drops(reason));
        ASSERT_EQ(1u, m_warnings.size());
        EXPECT_NE(std::string::npos,
                  m_warnings[0].find("refused a remote read from 127.0.0.1"))
                << m_warnings[0];
        receiver_iface()->put_refused_logged = 0;

        EXPECT_UCS_OK(get(region_addr(), m_rkey.rkey, 100, false, data));
        EXPECT_TRUE(std::equal(data.begin(), data.end(),
                               &m_expected[GUARD_SIZE]));
    }

    /* Random-size, random-offset, overlapping writes, the whole arena
     * compared with the expected image every 1,000 */
    void random_puts(size_t count)
    {
        size_t max_len = ucs_min(put_max_bcopy(), REGION_SIZE);

        for (size_t i = 0; i < count; ++i) {
            /* Mostly small writes, some up to the largest; overlapping ones
             * show whether they are applied in order */
            size_t length = ucs::rand() %
                            (ucs_min(max_len, 1ul << (i % 15)) + 1);
            size_t offset = ucs::rand() % (REGION_SIZE - length + 1);
            std::vector<uint8_t> data = pattern(length, i);

            put_ok(offset, &data[0], length);
            if ((i % 1000) == 999) {
                flush_sender();
                check_arena();
            }
        }

        flush_sender();
        check_arena();
        for (int reason = UCT_USNIC_RX_DROP_PUT_KEY;
             reason <= UCT_USNIC_RX_DROP_PUT_RANGE; ++reason) {
            EXPECT_EQ(0u, drops((uct_usnic_rx_drop_t)reason));
        }
    }

    entity               *m_receiver;
    entity               *m_sender;
    std::vector<uint8_t> m_arena;
    std::vector<uint8_t> m_expected;
    uct_mem_h            m_memh = NULL;
    uct_rkey_bundle_t    m_rkey;
    bool                 m_zcopy = false;
    std::list<zcopy_put> m_zcopy_puts;
};

const size_t  test_usnic_put::GUARD_SIZE;
const size_t  test_usnic_put::REGION_SIZE;
const uint8_t test_usnic_put::GUARD_BYTE;

UCS_TEST_P(test_usnic_put, caps) {
    const uct_iface_attr_t &attr = m_sender->iface_attr();
    uct_md_attr_t md_attr;

    ASSERT_UCS_OK(uct_md_query(m_receiver->md(), &md_attr));
    EXPECT_TRUE(md_attr.cap.flags & UCT_MD_FLAG_REG);
    EXPECT_TRUE(md_attr.cap.flags & UCT_MD_FLAG_NEED_RKEY);
    /* What UCP's RMA lanes ask for */
    EXPECT_TRUE(ucs_test_all_flags(attr.cap.flags,
                                   UCT_IFACE_FLAG_PUT_SHORT |
                                   UCT_IFACE_FLAG_PUT_BCOPY |
                                   UCT_IFACE_FLAG_GET_BCOPY |
                                   UCT_IFACE_FLAG_GET_ZCOPY |
                                   UCT_IFACE_FLAG_PENDING));
    EXPECT_FALSE(attr.cap.flags & UCT_IFACE_FLAG_GET_SHORT);
    EXPECT_GE(attr.cap.put.max_bcopy, 8192u);
    EXPECT_EQ(receiver_iface()->config.put_max_payload,
              attr.cap.put.max_short);
    EXPECT_GE(attr.cap.get.max_bcopy, 8192u);
    /* A zero-copy read is not gathered in a buffer */
    EXPECT_EQ(receiver_iface()->config.get_max_zcopy, attr.cap.get.max_zcopy);
    EXPECT_GT(attr.cap.get.max_zcopy, attr.cap.get.max_bcopy);
}

UCS_TEST_P(test_usnic_put, random_puts) {
    random_puts(100000 / ucs::test_time_multiplier());
}

UCS_TEST_P(test_usnic_put, random_zcopy_puts) {
    EXPECT_TRUE(m_sender->iface_attr().cap.flags & UCT_IFACE_FLAG_PUT_ZCOPY);
    EXPECT_EQ(put_max_bcopy(), m_sender->iface_attr().cap.put.max_zcopy);
    m_zcopy = true;
    random_puts(20000 / ucs::test_time_multiplier());
}

UCS_TEST_P(test_usnic_put, put_short) {
    std::vector<uint8_t> data = pattern(m_sender->iface_attr().cap.put.max_short,
                                        3);
    ucs_status_t status;

    for (size_t length = 0; length <= data.size(); length += 97) {
        do {
            status = uct_ep_put_short(m_sender->ep(0), &data[0], length,
                                      region_addr(length), m_rkey.rkey);
            progress();
        } while (status == UCS_ERR_NO_RESOURCE);
        ASSERT_UCS_OK(status);
        memcpy(&m_expected[GUARD_SIZE + length], &data[0], length);
    }
    flush_sender();
    check_arena();
}

UCS_TEST_P(test_usnic_put, get_after_put) {
    random_puts_gets(2000 / ucs::test_time_multiplier());
}

UCS_TEST_P(test_usnic_put, get_whole_region) {
    std::vector<uint8_t> data = pattern(REGION_SIZE, 8);
    std::vector<uint8_t> read;

    for (size_t offset = 0; offset < REGION_SIZE; offset += put_max_bcopy()) {
        put_ok(offset, &data[offset],
               ucs_min(put_max_bcopy(), REGION_SIZE - offset));
    }
    for (size_t offset = 0; offset < REGION_SIZE; offset += get_max()) {
        size_t length = ucs_min(get_max(), REGION_SIZE - offset);

        ASSERT_UCS_OK(get(region_addr(offset), m_rkey.rkey, length, true,
                          read));
        EXPECT_TRUE(std::equal(read.begin(), read.end(), &data[offset]));
    }
}

/* A flush completes only once the reads before it have their data */
struct flush_after_gets {
    uct_completion_t super;
    uct_completion_t gets;
    int              gets_left; /* When the flush completed */
};

static void flush_after_gets_cb(uct_completion_t *self)
{
    flush_after_gets *check = ucs_container_of(self, flush_after_gets, super);

    check->gets_left = check->gets.count;
}

UCS_TEST_P(test_usnic_put, flush_waits_for_gets) {
    static const int NUM_GETS = 8;
    std::vector<std::vector<uint8_t> > data(NUM_GETS);
    ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
    flush_after_gets check;
    ucs_status_t status;
    uct_iov_t iov;
    int i;

    check.gets.func    = comp_cb;
    check.gets.count   = NUM_GETS;
    check.gets.status  = UCS_OK;
    check.super.func   = flush_after_gets_cb;
    check.super.count  = 1;
    check.super.status = UCS_OK;
    check.gets_left    = -1;
    for (i = 0; i < NUM_GETS; ++i) {
        data[i].resize(get_max());
        iov.buffer = &data[i][0];
        iov.length = data[i].size();
        iov.memh   = UCT_MEM_HANDLE_NULL;
        iov.stride = 0;
        iov.count  = 1;
        do {
            status = uct_ep_get_zcopy(m_sender->ep(0), &iov, 1, region_addr(),
                                      m_rkey.rkey, &check.gets);
            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while (status == UCS_ERR_NO_RESOURCE);
        ASSERT_EQ(UCS_INPROGRESS, status);
    }

    ASSERT_EQ(UCS_INPROGRESS, uct_ep_flush(m_sender->ep(0), 0, &check.super));
    while ((check.super.count > 0) && (ucs_get_time() < deadline)) {
        progress();
    }
    EXPECT_EQ(0, check.super.count);
    EXPECT_EQ(0, check.gets_left) << "flush completed before the reads";
    EXPECT_UCS_OK(uct_ep_flush(m_sender->ep(0), 0, NULL));
    for (i = 0; i < NUM_GETS; ++i) {
        EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(),
                               &m_expected[GUARD_SIZE]));
    }
}

UCS_TEST_P(test_usnic_put, get_refused) {
    uct_usnic_rkey_t forged = *(uct_usnic_rkey_t*)m_rkey.rkey;
    uct_rkey_bundle_t rkey;
    uct_mem_h memh;

    check_get_refused(region_addr(REGION_SIZE - 10), m_rkey.rkey, 11,
                      UCT_USNIC_RX_DROP_GET_RANGE);
    check_get_refused((uintptr_t)&m_arena[0], m_rkey.rkey, get_max(),
                      UCT_USNIC_RX_DROP_GET_RANGE);
    forged.secret ^= 1;
    check_get_refused(region_addr(), (uintptr_t)&forged, 64,
                      UCT_USNIC_RX_DROP_GET_KEY);

    /* Registered for remote writes, not reads */
    memh = register_region(UCT_MD_MEM_ACCESS_REMOTE_PUT, &rkey);
    check_get_refused(region_addr(), rkey.rkey, 100,
                      UCT_USNIC_RX_DROP_GET_KEY);
    release_region(memh, &rkey);
}

UCS_TEST_P(test_usnic_put, whole_region) {
    std::vector<uint8_t> data = pattern(put_max_bcopy(), 1);

    put_ok(0, &data[0], data.size());
    put_ok(REGION_SIZE - data.size(), &data[0], data.size());
    flush_sender();
    check_arena();
}

UCS_TEST_P(test_usnic_put, unregistered_memory) {
    /* A valid key, but the guard in front of the region */
    check_refused((uintptr_t)&m_arena[0], m_rkey.rkey, 64,
                  UCT_USNIC_RX_DROP_PUT_RANGE);
    /* Behind the region, several datagrams */
    check_refused(region_addr(REGION_SIZE), m_rkey.rkey, put_max_bcopy(),
                  UCT_USNIC_RX_DROP_PUT_RANGE);
}

UCS_TEST_P(test_usnic_put, crossing_region_end) {
    /* The first datagrams fall inside the region, the last one does not:
     * none of them may be applied */
    size_t length = put_max_bcopy();

    check_refused(region_addr(REGION_SIZE - length + 1), m_rkey.rkey, length,
                  UCT_USNIC_RX_DROP_PUT_RANGE);
    check_refused(region_addr() - 1, m_rkey.rkey, 16,
                  UCT_USNIC_RX_DROP_PUT_RANGE);
}

UCS_TEST_P(test_usnic_put, wrong_secret) {
    uct_usnic_rkey_t forged = *(uct_usnic_rkey_t*)m_rkey.rkey;

    forged.secret ^= 1;
    check_refused(region_addr(), (uintptr_t)&forged, 3000,
                  UCT_USNIC_RX_DROP_PUT_KEY);
    forged.secret ^= 1;
    forged.id     += 1;
    check_refused(region_addr(), (uintptr_t)&forged, 10,
                  UCT_USNIC_RX_DROP_PUT_KEY);
}

UCS_TEST_P(test_usnic_put, after_dereg) {
    uct_usnic_rkey_t stale = *(uct_usnic_rkey_t*)m_rkey.rkey;

    release_region(m_memh, &m_rkey);
    m_memh = NULL;
    check_refused(region_addr(), (uintptr_t)&stale, 1000,
                  UCT_USNIC_RX_DROP_PUT_KEY);

    /* A new registration of the same memory has a key of its own */
    m_memh = register_region(UCT_MD_MEM_ACCESS_ALL, &m_rkey);
    check_refused(region_addr(), (uintptr_t)&stale, 1000,
                  UCT_USNIC_RX_DROP_PUT_KEY);
}

UCS_TEST_P(test_usnic_put, local_access_only) {
    uct_rkey_bundle_t rkey;
    uct_mem_h memh;

    /* The same memory, registered again for local access only */
    memh = register_region(UCT_MD_MEM_ACCESS_LOCAL_READ |
                           UCT_MD_MEM_ACCESS_LOCAL_WRITE, &rkey);
    check_refused(region_addr(), rkey.rkey, 100, UCT_USNIC_RX_DROP_PUT_KEY);
    release_region(memh, &rkey);
}

UCS_TEST_P(test_usnic_put, refusals_reported_once) {
    uct_usnic_rkey_t forged = *(uct_usnic_rkey_t*)m_rkey.rkey;
    std::vector<uint8_t> data(100, 1);

    forged.secret = ~forged.secret;
    m_warnings.clear();
    {
        scoped_log_handler slh(wrap_warns_logger);
        for (int i = 0; i < 50; ++i) {
            put(region_addr(), (uintptr_t)&forged, &data[0], data.size());
        }
        flush_sender();
    }

    EXPECT_EQ(50u, drops(UCT_USNIC_RX_DROP_PUT_KEY));
    EXPECT_EQ(1u, m_warnings.size());
    check_arena();
}

UCS_TEST_P(test_usnic_put, forged_datagram) {
    const uct_usnic_rkey_t *key = (const uct_usnic_rkey_t*)m_rkey.rkey;
    uct_usnic_iface_t *iface    = receiver_iface();
    struct {
        uct_usnic_hdr_t      hdr;
        uct_usnic_put_ext_t  put;
        uint8_t              data[64];
        uct_usnic_open_ext_t open;
    } UCS_S_PACKED packet;
    ucs_time_t deadline;

    /* Everything right but the secret, as an attacker who saw the traffic
     * and guessed would send it */
    memset(&packet, 0, sizeof(packet));
    packet.hdr.version          = UCT_USNIC_PROTO_VERSION;
    packet.hdr.type             = UCT_USNIC_PKT_PUT;
    packet.hdr.flags            = UCT_USNIC_PKT_FLAG_FIRST |
                                  UCT_USNIC_PKT_FLAG_LAST |
                                  UCT_USNIC_PKT_FLAG_OPEN;
    packet.hdr.incarnation      = iface->incarnation;
    packet.hdr.stream_id        = UCT_USNIC_STREAM_ID_NONE;
    packet.hdr.psn              = 1;
    packet.put.secret           = key->secret + 1;
    packet.put.address          = region_addr();
    packet.put.rkey_id          = key->id;
    packet.put.length           = sizeof(packet.data);
    packet.put.offset           = 0;
    memset(packet.data, 0x66, sizeof(packet.data));
    packet.open.src_incarnation = 0x5eed;
    packet.open.src_ep_serial   = 1;
    packet.open.src_in_addr     = htonl(INADDR_LOOPBACK);
    packet.open.src_prio_port   = htons(9);
    packet.open.src_data_port   = htons(9);
    packet.open.first_psn       = 1;
    packet.open.dst_open_key    = iface->open_key;

    m_warnings.clear();
    {
        scoped_log_handler slh(wrap_warns_logger);
        usnic_test::send_datagram(iface, UCT_USNIC_CHANNEL_DATA, &packet,
                                  sizeof(packet));

        /* Too short to hold the put extension */
        usnic_test::send_datagram(iface, UCT_USNIC_CHANNEL_DATA, &packet,
                                  sizeof(packet.hdr) + 8);

        deadline = ucs_get_time() + ucs_time_from_sec(10);
        while (((drops(UCT_USNIC_RX_DROP_PUT_KEY) < 1) ||
                (drops(UCT_USNIC_RX_DROP_INVALID) < 1)) &&
               (ucs_get_time() < deadline)) {
            progress();
        }
    }

    EXPECT_EQ(1u, drops(UCT_USNIC_RX_DROP_PUT_KEY));
    EXPECT_EQ(1u, drops(UCT_USNIC_RX_DROP_INVALID));
    ASSERT_EQ(1u, m_warnings.size());
    EXPECT_NE(std::string::npos, m_warnings[0].find("127.0.0.1:9"))
            << m_warnings[0];
    check_arena();

    /* The real sender is not disturbed */
    std::vector<uint8_t> good = pattern(5000, 5);
    put_ok(100, &good[0], good.size());
    flush_sender();
    check_arena();
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_put, usnic)


/* Remote writes through a lossy, reordering, duplicating, corrupting path:
 * every write applied exactly once and in order */
class test_usnic_put_faults : public test_usnic_put {
protected:
    void init()
    {
        uct_test::init(); /* the test body sets the faults first */
    }

    void random_puts_through(const std::map<std::string, std::string> &faults)
    {
        for (const auto &var : faults) {
            set_usnic_config(var.first, var.second);
        }
        create_entities();
        const uct_usnic_fault_t *fault =
                ucs_derived_of(m_sender->iface(), uct_usnic_iface_t)
                        ->channels[UCT_USNIC_CHANNEL_DATA].fault;
        ASSERT_NE(nullptr, fault);
        random_puts(3000 / ucs::test_time_multiplier());

        uint64_t injected = 0;
        for (int type = 0; type < UCT_USNIC_FAULT_LAST; ++type) {
            injected += fault->count[type];
        }
        UCS_TEST_MESSAGE << injected << " faults injected into the writes";
        EXPECT_GT(injected, 0u);
    }

    /* Progress until the reads counted by comp are done, each equal to the
     * bytes its entry of expected points to */
    void wait_reads(uct_completion_t *comp, ucs_time_t deadline,
                    const std::vector<std::vector<uint8_t> > &data,
                    const std::vector<const uint8_t*> &expected)
    {
        while ((comp->count > 0) && (ucs_get_time() < deadline)) {
            progress();
        }
        ASSERT_EQ(0, comp->count) << "reads not completed";
        EXPECT_UCS_OK(comp->status);
        for (size_t i = 0; i < data.size(); ++i) {
            EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(),
                                   expected[i]))
                    << "read " << i;
        }
    }
};

UCS_TEST_P(test_usnic_put_faults, drop_1_percent) {
    random_puts_through({{"FAULT_DROP", "0.01"}});
}

UCS_TEST_P(test_usnic_put_faults, drop_5_percent) {
    random_puts_through({{"FAULT_DROP", "0.05"}});
}

UCS_TEST_P(test_usnic_put_faults, zcopy_drop_5_percent) {
    m_zcopy = true;
    random_puts_through({{"FAULT_DROP", "0.05"}});
}

UCS_TEST_P(test_usnic_put_faults, drop_20_percent) {
    random_puts_through({{"FAULT_DROP", "0.2"}});
}

UCS_TEST_P(test_usnic_put_faults, gets_drop_10_percent) {
    set_usnic_config("FAULT_DROP", "0.1");
    create_entities();
    random_puts_gets(500 / ucs::test_time_multiplier());
    EXPECT_GT(USNIC_COUNTER(usnic_iface(m_sender), TX_RESENDS) +
              USNIC_COUNTER(receiver_iface(), TX_RESENDS), 0u);
}

/* The target's reply is lost, then it deregisters the memory: the resent
 * reply must not read the memory, and the requester learns the read failed */
UCS_TEST_P(test_usnic_put_faults, get_reply_resent_after_dereg) {
    set_usnic_config("FAULT_DROP", "1");
    set_usnic_config("FAULT_CHANNELS", "data");
    create_entities();
    ucs_derived_of(m_sender->iface(), uct_usnic_iface_t)
            ->channels[UCT_USNIC_CHANNEL_DATA]
            .fault->prob[UCT_USNIC_FAULT_DROP] = 0;
    uct_usnic_fault_t *target_fault =
            receiver_iface()->channels[UCT_USNIC_CHANNEL_DATA].fault;

    ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
    std::vector<uint8_t> data(get_max(), 0);
    uct_completion_t comp = {comp_cb, 1, UCS_OK};
    uct_iov_t iov         = {&data[0], data.size(), UCT_MEM_HANDLE_NULL, 0, 1};
    ASSERT_EQ(UCS_INPROGRESS,
              uct_ep_get_zcopy(m_sender->ep(0), &iov, 1, region_addr(),
                               m_rkey.rkey, &comp));
    while ((target_fault->count[UCT_USNIC_FAULT_DROP] == 0) &&
           (ucs_get_time() < deadline)) {
        progress();
    }
    ASSERT_GT(target_fault->count[UCT_USNIC_FAULT_DROP], 0u);

    release_region(m_memh, &m_rkey);
    m_memh                                  = NULL;
    target_fault->prob[UCT_USNIC_FAULT_DROP] = 0;
    while ((comp.count > 0) && (ucs_get_time() < deadline)) {
        progress();
    }
    ASSERT_EQ(0, comp.count) << "read not completed";
    EXPECT_EQ(UCS_ERR_INVALID_ADDR, comp.status);
    EXPECT_GT(USNIC_COUNTER(receiver_iface(), TX_READS_REVOKED), 0u);
    EXPECT_EQ(std::vector<uint8_t>(data.size(), 0), data);
}

/* Reads larger than the window go out as the window opens, also after
 * losses closed it to its smallest; a read asked for while the reply
 * before it is under way waits for it */
UCS_TEST_P(test_usnic_put_faults, gets_larger_than_window) {
    static const int NUM_READS = 3;
    static const size_t SHIFT  = 4096;
    set_usnic_config("WINDOW", "64");
    set_usnic_config("GET_MAX_ZCOPY", "1m");
    set_usnic_config("FAULT_DROP", "0.02");
    create_entities();

    size_t source_len = 1024 * 1024;
    size_t length     = source_len - (NUM_READS - 1) * SHIFT;
    ASSERT_EQ(source_len, m_sender->iface_attr().cap.get.max_zcopy);
    ASSERT_GT(length, 64 * receiver_iface()->config.get_max_payload);
    std::vector<uint8_t> source = pattern(source_len, 5);
    std::vector<uint8_t> packed(sizeof(uct_usnic_rkey_t));
    uct_rkey_bundle_t rkey;
    uct_mem_h memh;
    ASSERT_UCS_OK(uct_md_mem_reg(m_receiver->md(), &source[0], source_len,
                                 UCT_MD_MEM_ACCESS_ALL, &memh));
    ASSERT_UCS_OK(uct_md_mkey_pack(m_receiver->md(), memh, &packed[0]));
    ASSERT_UCS_OK(uct_rkey_unpack(GetParam()->component, &packed[0], &rkey));

    ucs_time_t deadline = ucs_get_time() + ucs_time_from_sec(60);
    std::vector<std::vector<uint8_t> > data(NUM_READS,
                                            std::vector<uint8_t>(length, 0));
    uct_completion_t comp = {comp_cb, NUM_READS, UCS_OK};
    ucs_status_t status;
    for (int i = 0; i < NUM_READS; ++i) {
        uct_iov_t iov = {&data[i][0], length, UCT_MEM_HANDLE_NULL, 0, 1};
        do {
            status = uct_ep_get_zcopy(m_sender->ep(0), &iov, 1,
                                      (uintptr_t)&source[i * SHIFT],
                                      rkey.rkey, &comp);
            if (status == UCS_ERR_NO_RESOURCE) {
                progress();
            }
        } while ((status == UCS_ERR_NO_RESOURCE) &&
                 (ucs_get_time() < deadline));
        ASSERT_EQ(UCS_INPROGRESS, status) << "read " << i;
        /* The next request comes while this reply is on its way */
        ucs_time_t next = ucs_get_time() + ucs_time_from_usec(500);
        while ((ucs_get_time() < next) && (comp.count > 0)) {
            progress();
        }
    }
    std::vector<const uint8_t*> expected;
    for (int i = 0; i < NUM_READS; ++i) {
        expected.push_back(&source[i * SHIFT]);
    }
    ASSERT_NO_FATAL_FAILURE(wait_reads(&comp, deadline, data, expected));
    EXPECT_GT(USNIC_COUNTER(receiver_iface(), TX_RESENDS), 0u);
    EXPECT_UCS_OK(uct_rkey_release(GetParam()->component, &rkey));
    EXPECT_UCS_OK(uct_md_mem_dereg(m_receiver->md(), memh));
}

/* Reads that wait for the target's send buffers (TX_MAX_BUFS) all get their
 * data: waiting takes no send buffer, so none is lost for want of one */
UCS_TEST_P(test_usnic_put_faults, gets_beyond_send_buffers) {
    static const int NUM_READS  = 40;
    static const size_t LENGTH  = 32 * 1024;
    static const size_t SHIFT   = 1024;
    create_entities("16");

    ASSERT_GT(LENGTH, 16 * receiver_iface()->config.get_max_payload);
    std::vector<uint8_t> source = pattern(REGION_SIZE, 7);
    std::copy(source.begin(), source.end(), region());
    std::vector<std::vector<uint8_t> > data(NUM_READS,
                                            std::vector<uint8_t>(LENGTH, 0));
    uct_completion_t comp = {comp_cb, NUM_READS, UCS_OK};
    std::vector<const uint8_t*> expected;
    for (int i = 0; i < NUM_READS; ++i) {
        size_t offset = (i * SHIFT) % (REGION_SIZE - LENGTH);
        uct_iov_t iov = {&data[i][0], LENGTH, UCT_MEM_HANDLE_NULL, 0, 1};
        ASSERT_EQ(UCS_INPROGRESS,
                  uct_ep_get_zcopy(m_sender->ep(0), &iov, 1,
                                   region_addr(offset), m_rkey.rkey, &comp))
                << "read " << i;
        expected.push_back(region() + offset);
    }

    wait_reads(&comp, ucs_get_time() + ucs_time_from_sec(20), data,
               expected);
    EXPECT_EQ(0u, USNIC_DROPS(receiver_iface(), NO_RESOURCE));
}

UCS_TEST_P(test_usnic_put_faults, reorder_duplicate_corrupt) {
    random_puts_through({{"CHECKSUM", "y"},
                         {"FAULT_REORDER", "0.05"},
                         {"FAULT_DUPLICATE", "0.05"},
                         {"FAULT_CORRUPT", "0.05"}});
}

_UCT_INSTANTIATE_TEST_CASE(test_usnic_put_faults, usnic)
