/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_COMPAT_H
#define UCT_USNIC_COMPAT_H

/*
 * The module is written against the UCT internal API of UCX 1.22. Every
 * difference to other UCX releases (1.13 is the oldest supported one) lives
 * in this header, so the rest of the module reads as a plain 1.22 transport.
 * UCX is told apart by UCT_API, which is generated into uct/api/version.h
 * and therefore reliable at build time. The module uses only libfabric API
 * common to 1.x and 2.x; a difference there would be found by a feature
 * check in configure.m4 and handled here too.
 */

#include <uct/api/uct.h>
#include <uct/api/v2/uct_v2.h>
#include <uct/base/uct_component.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <ucs/datastruct/mpool.h>
#include <ucs/sys/string.h>
#include <ucs/sys/stubs.h>
/* The power-of-two helpers left ucs/sys/math.h for this header (1.18 has
 * it, 1.13 not); which release moved them is not recorded here, the header
 * itself is the test */
#if __has_include(<ucs/sys/ptr_arith.h>)
#include <ucs/sys/ptr_arith.h>
#endif

#include <rdma/fabric.h>
#include <stdarg.h>
#include <string.h>


#define UCT_USNIC_UCX_GE(_major, _minor) \
    (UCT_API >= UCT_VERSION(_major, _minor))


static UCS_F_MAYBE_UNUSED unsigned
uct_usnic_mpool_max_elems(const uct_iface_mpool_config_t *config)
{
    return (config->max_bufs < 0) ? UINT_MAX : config->max_bufs;
}

/* Buffers added at a time: the configured or given growth, never more than
 * the pool may hold (a smaller MAX_BUFS alone must not be an error) */
static UCS_F_MAYBE_UNUSED unsigned
uct_usnic_mpool_grow(const uct_iface_mpool_config_t *config, unsigned grow)
{
    return ucs_min((config->bufs_grow != 0) ? config->bufs_grow : grow,
                   uct_usnic_mpool_max_elems(config));
}


/*
 * Each section below is keyed on the release that brought the names it
 * handles, and defines nothing that the UCX in use already has.
 */

/* UCX 1.14: md_query and mem_reg with v2 parameters, mkey_pack with the
 * region, mem_attach, ep_connect_to_ep_v2, mpool parameters, mpool chunk
 * size and grow factor in the configuration */
#if UCT_USNIC_UCX_GE(1, 14)

#define UCT_USNIC_MD_QUERY(_func)          _func
#define UCT_USNIC_MD_QUERY_ADAPTER(_func)
#define UCT_USNIC_MEM_REG(_func)           _func
#define UCT_USNIC_MEM_REG_ADAPTER(_func)
#define UCT_USNIC_MKEY_PACK(_func)         _func
#define UCT_USNIC_MKEY_PACK_ADAPTER(_func)

#define UCT_USNIC_MD_OPS_1_14 \
    .mem_attach = (uct_md_mem_attach_func_t) \
            ucs_empty_function_return_unsupported,

#define UCT_USNIC_IFACE_INTERNAL_OPS_1_14 \
        .ep_connect_to_ep_v2 = (uct_ep_connect_to_ep_v2_func_t) \
                ucs_empty_function_return_unsupported,

#define UCT_USNIC_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _dfl_max, _dfl_grow, \
                                            _mp_name, _offset, _desc) \
    UCT_IFACE_MPOOL_CONFIG_FIELDS(_prefix, _dfl_max, _dfl_grow, 128m, 1.0, \
                                  _mp_name, _offset, _desc)

static UCS_F_MAYBE_UNUSED ucs_status_t
uct_usnic_mpool_init(ucs_mpool_t *mp, size_t priv_size, size_t elem_size,
                     size_t align_offset, size_t alignment,
                     const uct_iface_mpool_config_t *config, unsigned grow,
                     ucs_mpool_ops_t *ops, const char *name)
{
    ucs_mpool_params_t params;

    ucs_mpool_params_reset(&params);
    params.priv_size       = priv_size;
    params.elem_size       = elem_size;
    params.align_offset    = align_offset;
    params.alignment       = alignment;
    params.max_elems       = uct_usnic_mpool_max_elems(config);
    params.elems_per_chunk = uct_usnic_mpool_grow(config, grow);
    params.max_chunk_size  = config->max_chunk_size;
    params.grow_factor     = config->grow_factor;
    params.ops             = ops;
    params.name            = name;
    return ucs_mpool_init(&params, mp);
}

#else

typedef struct {
    uint64_t          field_mask;
    uint64_t          max_alloc;
    size_t            max_reg;
    uint64_t          flags;
    uint64_t          reg_mem_types;
    uint64_t          cache_mem_types;
    uint64_t          detect_mem_types;
    uint64_t          alloc_mem_types;
    uint64_t          access_mem_types;
    ucs_linear_func_t reg_cost;
    size_t            rkey_packed_size;
    ucs_cpu_set_t     local_cpus;
    size_t            reg_alignment;
} uct_md_attr_v2_t;

enum {
    UCT_MD_MEM_REG_FIELD_FLAGS = UCS_BIT(0)
};

typedef struct {
    uint64_t field_mask;
    uint64_t flags;
} uct_md_mem_reg_params_t;

#define UCT_MD_MEM_REG_FIELD_VALUE(_params, _name, _flag, _default) \
    (((_params)->field_mask & UCT_MD_MEM_REG_##_flag) ? \
     (_params)->_name : (_default))

static UCS_F_MAYBE_UNUSED void uct_md_base_md_query(uct_md_attr_v2_t *md_attr)
{
    memset(md_attr, 0, sizeof(*md_attr));
    md_attr->max_reg       = ULONG_MAX;
    md_attr->reg_alignment = 1;
    memset(&md_attr->local_cpus, 0xff, sizeof(md_attr->local_cpus));
}

#define UCT_USNIC_MD_QUERY(_func) _func##_v1
#define UCT_USNIC_MD_QUERY_ADAPTER(_func) \
    static ucs_status_t _func##_v1(uct_md_h md, uct_md_attr_t *md_attr) \
    { \
        uct_md_attr_v2_t attr; \
        ucs_status_t status; \
        \
        status = _func(md, &attr); \
        if (status != UCS_OK) { \
            return status; \
        } \
        \
        md_attr->cap.max_alloc        = attr.max_alloc; \
        md_attr->cap.max_reg          = attr.max_reg; \
        md_attr->cap.flags            = attr.flags; \
        md_attr->cap.reg_mem_types    = attr.reg_mem_types; \
        md_attr->cap.detect_mem_types = attr.detect_mem_types; \
        md_attr->cap.alloc_mem_types  = attr.alloc_mem_types; \
        md_attr->cap.access_mem_types = attr.access_mem_types; \
        md_attr->reg_cost             = attr.reg_cost; \
        md_attr->rkey_packed_size     = attr.rkey_packed_size; \
        md_attr->local_cpus           = attr.local_cpus; \
        return UCS_OK; \
    }

#define UCT_USNIC_MEM_REG(_func) _func##_v1
#define UCT_USNIC_MEM_REG_ADAPTER(_func) \
    static ucs_status_t _func##_v1(uct_md_h md, void *address, size_t length, \
                                   unsigned flags, uct_mem_h *memh_p) \
    { \
        uct_md_mem_reg_params_t params = { \
            .field_mask = UCT_MD_MEM_REG_FIELD_FLAGS, \
            .flags      = flags \
        }; \
        \
        return _func(md, address, length, &params, memh_p); \
    }

#define UCT_USNIC_MKEY_PACK(_func) _func##_v1
#define UCT_USNIC_MKEY_PACK_ADAPTER(_func) \
    static ucs_status_t _func##_v1(uct_md_h md, uct_mem_h memh, \
                                   const uct_md_mkey_pack_params_t *params, \
                                   void *buffer) \
    { \
        return _func(md, memh, NULL, SIZE_MAX, params, buffer); \
    }

#define UCT_USNIC_MD_OPS_1_14
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_14

#define UCT_USNIC_IFACE_MPOOL_CONFIG_FIELDS UCT_IFACE_MPOOL_CONFIG_FIELDS

static UCS_F_MAYBE_UNUSED ucs_status_t
uct_usnic_mpool_init(ucs_mpool_t *mp, size_t priv_size, size_t elem_size,
                     size_t align_offset, size_t alignment,
                     const uct_iface_mpool_config_t *config, unsigned grow,
                     ucs_mpool_ops_t *ops, const char *name)
{
    return ucs_mpool_init(mp, priv_size, elem_size, align_offset, alignment,
                          uct_usnic_mpool_grow(config, grow),
                          uct_usnic_mpool_max_elems(config), ops, name);
}

#endif


/* UCX 1.15: reachability scope */
#if !UCT_USNIC_UCX_GE(1, 15)
typedef enum {
    UCT_IFACE_REACHABILITY_SCOPE_NETWORK,
    UCT_IFACE_REACHABILITY_SCOPE_DEVICE
} uct_iface_reachability_scope_t;
#endif


/* UCX 1.16: the v2 reachability and ep_is_connected internal ops, rkey
 * comparison; is_sockaddr_accessible gone */
#if UCT_USNIC_UCX_GE(1, 16)

/* ops.iface_is_reachable: UCX wraps v1 calls into the internal v2 op */
#define UCT_USNIC_IFACE_IS_REACHABLE(_func) uct_base_iface_is_reachable
#define UCT_USNIC_IFACE_IS_REACHABLE_ADAPTER(_func)

#define UCT_USNIC_IFACE_INTERNAL_OPS_1_16(_is_reachable_v2, _ep_is_connected) \
        .iface_is_reachable_v2 = _is_reachable_v2, \
        .ep_is_connected       = _ep_is_connected,

#define UCT_USNIC_COMPONENT_RKEY_COMPARE .rkey_compare = uct_base_rkey_compare,

#define UCT_USNIC_MD_OPS_1_16

#else

enum {
    UCT_EP_IS_CONNECTED_FIELD_DEVICE_ADDR = UCS_BIT(0),
    UCT_EP_IS_CONNECTED_FIELD_IFACE_ADDR  = UCS_BIT(1)
};

typedef struct {
    uint64_t                field_mask;
    const uct_device_addr_t *device_addr;
    const uct_iface_addr_t  *iface_addr;
} uct_ep_is_connected_params_t;

/* Only the v1 reachability op: build the v2 parameters here */
#define UCT_USNIC_IFACE_IS_REACHABLE(_func) _func##_v1
#define UCT_USNIC_IFACE_IS_REACHABLE_ADAPTER(_func) \
    static int _func##_v1(const uct_iface_h iface, \
                          const uct_device_addr_t *device_addr, \
                          const uct_iface_addr_t *iface_addr) \
    { \
        uct_iface_is_reachable_params_t params = { \
            .field_mask  = UCT_IFACE_IS_REACHABLE_FIELD_DEVICE_ADDR | \
                           UCT_IFACE_IS_REACHABLE_FIELD_IFACE_ADDR, \
            .device_addr = device_addr, \
            .iface_addr  = iface_addr \
        }; \
        \
        return _func(iface, &params); \
    }

#define UCT_USNIC_IFACE_INTERNAL_OPS_1_16(_is_reachable_v2, _ep_is_connected)

#define UCT_USNIC_COMPONENT_RKEY_COMPARE

#define UCT_USNIC_MD_OPS_1_16 \
    .is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t) \
            ucs_empty_function_return_zero_int,

static UCS_F_MAYBE_UNUSED int
uct_iface_is_reachable_params_valid(
        const uct_iface_is_reachable_params_t *params, uint64_t flags)
{
    if (!ucs_test_all_flags(params->field_mask, flags)) {
        ucs_error("uct_iface_is_reachable: missing params "
                  "(field_mask: %lu, expected: %lu)",
                  params->field_mask, flags);
        return 0;
    }

    if (params->field_mask & UCT_IFACE_IS_REACHABLE_FIELD_INFO_STRING) {
        if (params->info_string == NULL) {
            ucs_error("uct_iface_is_reachable: null info_string passed");
            return 0;
        }
        params->info_string[0] = '\0';
    }

    return 1;
}

#endif


/* UCX 1.18: inter-node flag, reachability reasons */
#if !UCT_USNIC_UCX_GE(1, 18)

#define UCT_IFACE_FLAG_INTER_NODE 0

static UCS_F_MAYBE_UNUSED UCS_F_PRINTF(2, 3) void
uct_iface_fill_info_str_buf(const uct_iface_is_reachable_params_t *params,
                            const char *fmt, ...)
{
    va_list ap;

    if (!(params->field_mask & UCT_IFACE_IS_REACHABLE_FIELD_INFO_STRING) ||
        (params->info_string == NULL) ||
        !(params->field_mask &
          UCT_IFACE_IS_REACHABLE_FIELD_INFO_STRING_LENGTH)) {
        return;
    }

    va_start(ap, fmt);
    ucs_vsnprintf_safe(params->info_string, params->info_string_length, fmt,
                       ap);
    va_end(ap);
}

#endif


/* UCX 1.19: rkey_unpack with parameters */
#if UCT_USNIC_UCX_GE(1, 19)

#define UCT_USNIC_RKEY_UNPACK(_func)       _func
#define UCT_USNIC_RKEY_UNPACK_ADAPTER(_func)

#else

typedef struct {
    uint64_t field_mask;
} uct_rkey_unpack_params_t;

#define UCT_USNIC_RKEY_UNPACK(_func) _func##_v1
#define UCT_USNIC_RKEY_UNPACK_ADAPTER(_func) \
    static ucs_status_t _func##_v1(uct_component_t *component, \
                                   const void *buffer, uct_rkey_t *rkey_p, \
                                   void **handle_p) \
    { \
        uct_rkey_unpack_params_t params = {.field_mask = 0}; \
        \
        return _func(component, buffer, &params, rkey_p, handle_p); \
    }

#endif


/* UCX 1.20: iface_query_v2 and ep_get_device_ep internal ops */
#if UCT_USNIC_UCX_GE(1, 20)
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_20 \
        .iface_query_v2        = uct_iface_base_query_v2, \
        .ep_get_device_ep      = (uct_ep_get_device_ep_func_t) \
                ucs_empty_function_return_unsupported,
#else
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_20
#endif


/* Internal op ep_invalidate (we use none of its arguments): UCX 1.21
 * passes parameters, older releases flags */
#define UCT_USNIC_EP_INVALIDATE(_func) _func##_op
#if UCT_USNIC_UCX_GE(1, 21)
#define UCT_USNIC_EP_INVALIDATE_ADAPTER(_func) \
    static ucs_status_t _func##_op(uct_ep_h ep, \
                                   const uct_ep_invalidate_params_t *params) \
    { \
        return _func(ep); \
    }
#else
#define UCT_USNIC_EP_INVALIDATE_ADAPTER(_func) \
    static ucs_status_t _func##_op(uct_ep_h ep, unsigned flags) \
    { \
        return _func(ep); \
    }
#endif


/* UCX 1.22: ep_put_sgl_zcopy internal op, mem_elem_pack */
#if UCT_USNIC_UCX_GE(1, 22)
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_22 \
        .ep_put_sgl_zcopy      = (uct_ep_put_sgl_zcopy_func_t) \
                ucs_empty_function_return_unsupported,
#define UCT_USNIC_MD_OPS_1_22 \
    .mem_elem_pack = (uct_md_mem_elem_pack_func_t) \
            ucs_empty_function_return_unsupported,
#else
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_22
#define UCT_USNIC_MD_OPS_1_22
#endif


/* UCX 1.23 (master today): ep_get_sgl_zcopy and ep_outstanding_purge
 * internal ops; its iface constructor asserts that the latter is set */
#if UCT_USNIC_UCX_GE(1, 23)
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_23 \
        .ep_get_sgl_zcopy      = (uct_ep_get_sgl_zcopy_func_t) \
                ucs_empty_function_return_unsupported, \
        .ep_outstanding_purge  = (uct_ep_outstanding_purge_func_t) \
                ucs_empty_function_return_unsupported,
#else
#define UCT_USNIC_IFACE_INTERNAL_OPS_1_23
#endif


/* Members of uct_md_ops_t that only some releases have */
#define UCT_USNIC_MD_OPS_VERSIONED \
    UCT_USNIC_MD_OPS_1_14 \
    UCT_USNIC_MD_OPS_1_16 \
    UCT_USNIC_MD_OPS_1_22

/* Members of uct_iface_internal_ops_t that only some releases have */
#define UCT_USNIC_IFACE_INTERNAL_OPS_VERSIONED(_is_reachable_v2, \
                                               _ep_is_connected) \
    UCT_USNIC_IFACE_INTERNAL_OPS_1_14 \
    UCT_USNIC_IFACE_INTERNAL_OPS_1_16(_is_reachable_v2, _ep_is_connected) \
    UCT_USNIC_IFACE_INTERNAL_OPS_1_20 \
    UCT_USNIC_IFACE_INTERNAL_OPS_1_22 \
    UCT_USNIC_IFACE_INTERNAL_OPS_1_23


/* Lengths of the peer's addresses: 1.18 passes them, older releases trust
 * the caller */
#if UCT_USNIC_UCX_GE(1, 18)
#define UCT_USNIC_REACHABLE_LENGTH(_params, _field, _flag, _default) \
    UCS_PARAM_VALUE(UCT_IFACE_IS_REACHABLE_FIELD, _params, _field, _flag, \
                    _default)
#define UCT_USNIC_REACHABLE_SCOPE(_params) \
    UCS_PARAM_VALUE(UCT_IFACE_IS_REACHABLE_FIELD, _params, scope, SCOPE, \
                    UCT_IFACE_REACHABILITY_SCOPE_NETWORK)
#else
#define UCT_USNIC_REACHABLE_LENGTH(_params, _field, _flag, _default) (_default)
#define UCT_USNIC_REACHABLE_SCOPE(_params) UCT_IFACE_REACHABILITY_SCOPE_NETWORK
#endif


#endif
