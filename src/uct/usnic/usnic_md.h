/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_MD_H
#define UCT_USNIC_MD_H

#include "usnic_compat.h"

#include <ucs/datastruct/mpool.h>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>


/* libfabric API version of the headers the module is built with */
#define UCT_USNIC_FI_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)


/* Provider choice: the usNIC one when the machine has a Cisco VIC, else the
 * portable UDP one */
#define UCT_USNIC_PROVIDER_AUTO "auto"


typedef struct uct_usnic_md_config {
    uct_md_config_t super;
    char            *provider; /* libfabric provider name, or "auto" */
} uct_usnic_md_config_t;


/**
 * One memory domain per libfabric DGRAM domain: the MD owns the fabric and
 * the domain, ifaces open their endpoints on it.
 */
typedef struct uct_usnic_md {
    uct_md_t           super;
    struct fi_info     *info;   /* Description of the domain */
    struct fid_fabric  *fabric;
    struct fid_domain  *domain;
    int                mr_local; /* Provider needs local registration */
} uct_usnic_md_t;


/**
 * Registered memory region.
 */
typedef struct uct_usnic_memh {
    void          *address;
    size_t        length;
    struct fid_mr *mr;   /* libfabric registration, with FI_MR_LOCAL only */
} uct_usnic_memh_t;


extern uct_component_t uct_usnic_component;


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
