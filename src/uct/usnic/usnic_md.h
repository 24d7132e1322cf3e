/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_MD_H
#define UCT_USNIC_MD_H

#include "usnic_compat.h"
#include "usnic_topo.h"

#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/mpool.h>
#include <ucs/datastruct/ptr_array.h>
#include <ucs/type/spinlock.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <xxhash.h>


/* libfabric API version of the headers the module is built with */
#define UCT_USNIC_FI_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)


/* Provider choice: libfabric's usNIC one when the machine has a Cisco VIC,
 * else the built-in one over the kernel's UDP sockets; any other libfabric
 * datagram provider by name */
#define UCT_USNIC_PROVIDER_AUTO   "auto"
#define UCT_USNIC_PROVIDER_KERNEL "kernel"
#define UCT_USNIC_PROVIDER_USNIC  "usnic"  /* libfabric's, on Cisco VIC */


typedef struct uct_usnic_md_config {
    uct_md_config_t super;
    char            *provider; /* libfabric provider, "kernel" or "auto" */
    int             force_mr_local;
    int             force_av_map;
    int             prefer_nearest_device;
} uct_usnic_md_config_t;


/* No subnet known from the provider */
#define UCT_USNIC_PREFIX_LEN_UNKNOWN UINT8_MAX


/**
 * One memory domain per libfabric DGRAM domain, or per IPv4 interface on the
 * kernel provider: the MD owns libfabric's fabric and domain, ifaces open
 * their endpoints on it.
 */
typedef struct uct_usnic_md {
    uct_md_t             super;
    struct fi_info       *info;   /* Description of the domain */
    int                  kernel;  /* Built-in kernel provider: no fabric and
                                     no domain */
    struct fid_fabric    *fabric;
    struct fid_domain    *domain;
    int                  mr_local; /* Provider needs local registration */
    int                  force_mr_local; /* ... or a test switch wants it */
    uint64_t             next_mr_key; /* Without FI_MR_PROV_KEY */
    double               link_speed; /* bits/s, 0 unless the provider tells */
    uint8_t              prefix_len; /* Subnet from the provider, or
                                        UCT_USNIC_PREFIX_LEN_UNKNOWN */
    ucs_ptr_array_t      regs;     /* Registration id -> uct_usnic_memh_t */
    ucs_spinlock_t       regs_lock; /* Registrations vs. remote writes */
    uct_usnic_topo_dev_t topo;     /* Where the device sits */
    int                  prefer_nearest_device; /* Far devices report a
                                                   higher latency */
} uct_usnic_md_t;


/**
 * Remote key: names a registration and proves the right to write to it. It
 * is also the packed form.
 */
typedef struct uct_usnic_rkey {
    uint64_t secret; /* Random, drawn for each registration */
    uint32_t id;     /* Index in the target MD's registrations */
} UCS_S_PACKED uct_usnic_rkey_t;


/**
 * Registered memory region.
 */
typedef struct uct_usnic_memh {
    void             *address;
    size_t           length;
    struct fid_mr    *mr;           /* libfabric registration, FI_MR_LOCAL */
    uct_usnic_rkey_t rkey;
    int              remote_write; /* UCT_MD_MEM_ACCESS_REMOTE_PUT given */
    int              remote_read;  /* UCT_MD_MEM_ACCESS_REMOTE_GET given */
} uct_usnic_memh_t;


/* Whether a remote write or read was carried out, or why not */
typedef enum {
    UCT_USNIC_MD_ACCESS_OK,
    UCT_USNIC_MD_ACCESS_BAD_KEY,   /* No such live registration, wrong
                                      secret, or no such remote access */
    UCT_USNIC_MD_ACCESS_BAD_RANGE  /* Not entirely inside the registration */
} uct_usnic_md_access_result_t;


extern uct_component_t uct_usnic_component;


/* Fill a buffer from the kernel's random source */
ucs_status_t uct_usnic_random(void *buf, size_t length);


/* Random, drawn when the first MD opens */
extern uint64_t uct_usnic_hash_seed;


/* Hash of a key that peers choose (stream keys, incarnations, addresses):
 * seeded, so that nobody outside the process can aim at collisions */
static UCS_F_ALWAYS_INLINE khint_t uct_usnic_hash64(uint64_t key)
{
    return (khint_t)XXH3_64bits_withSeed(&key, sizeof(key),
                                         uct_usnic_hash_seed);
}

#define uct_usnic_hash64_equal(_a, _b) ((_a) == (_b))


/* The IPv4 interfaces (the one named domain_name), described as libfabric
 * describes its domains, for the kernel provider (usnic_sock.c) */
ucs_status_t uct_usnic_sock_getinfo(const char *domain_name,
                                    struct fi_info **info_p);


/*
 * A remote peer's write of data_length bytes at offset within
 * [address, address + length), done only if the key grants write access to
 * the whole range. Holds the registrations' lock, so that a concurrent
 * deregistration cannot pull the memory away in between.
 */
uct_usnic_md_access_result_t
uct_usnic_md_write(uct_usnic_md_t *md, const uct_usnic_rkey_t *rkey,
                   uint64_t address, size_t length, size_t offset,
                   const void *data, size_t data_length);


/*
 * Before a remote peer's read of [address, address + length): on
 * UCT_USNIC_MD_ACCESS_OK, the registrations stay locked until
 * uct_usnic_md_read_end(), so that no deregistration pulls the memory away
 * while the caller sends from it.
 */
uct_usnic_md_access_result_t
uct_usnic_md_read_begin(uct_usnic_md_t *md, const uct_usnic_rkey_t *rkey,
                        uint64_t address, size_t length);


void uct_usnic_md_read_end(uct_usnic_md_t *md);


ucs_status_t uct_usnic_md_query_devices(uct_md_h md,
                                        uct_tl_device_resource_t **devices_p,
                                        unsigned *num_devices_p);


/* Initializes a buffer of a pool; mr_desc is its local registration, for
 * fi_send/fi_recv, or NULL when the provider needs none */
typedef void (*uct_usnic_mpool_obj_init_t)(void *obj, void *mr_desc);


ucs_status_t uct_usnic_md_mpool_init(uct_usnic_md_t *md, ucs_mpool_t *mp,
                                     size_t elem_size, size_t align_offset,
                                     size_t alignment,
                                     const uct_iface_mpool_config_t *config,
                                     unsigned grow,
                                     uct_usnic_mpool_obj_init_t obj_init,
                                     const char *name);

#endif
