/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_md.h"

#include <ucs/arch/atomic.h>
#include <ucs/arch/bitops.h>
#include <ucs/arch/cpu.h>
#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/string.h>
#include <ucs/type/init_once.h>

#include <rdma/fi_errno.h>
#if HAVE_USNIC_FI_EXT
#  include <rdma/fi_ext_usnic.h>
#endif
#include <netinet/in.h>
#include <sys/random.h>


static ucs_config_field_t uct_usnic_md_config_table[] = {
    {"", "", NULL,
     ucs_offsetof(uct_usnic_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},

    {"PROVIDER", UCT_USNIC_PROVIDER_AUTO,
     "What carries the datagrams: \"kernel\", the built-in provider over the\n"
     "kernel's UDP sockets (batched, with segmentation offload), or a\n"
     "libfabric provider offering FI_EP_DGRAM with IPv4 addresses, such as\n"
     "\"usnic\" (Cisco VIC) or \"udp\". \"auto\" selects \"usnic\" when\n"
     "libfabric finds it, otherwise \"kernel\".",
     ucs_offsetof(uct_usnic_md_config_t, provider), UCS_CONFIG_TYPE_STRING},

    {"FORCE_MR_LOCAL", "n",
     "Test switch: behave as the usnic provider demands (FI_MR_LOCAL) on any\n"
     "libfabric provider: register every buffer handed to it and pass its\n"
     "descriptor, and send every datagram from a registered send slot\n"
     "rather than with fi_inject.",
     ucs_offsetof(uct_usnic_md_config_t, force_mr_local),
     UCS_CONFIG_TYPE_BOOL},

    {"FORCE_AV_MAP", "n",
     "Test switch: open the address vector as FI_AV_MAP, the only kind the\n"
     "usnic provider offers, on any libfabric provider.",
     ucs_offsetof(uct_usnic_md_config_t, force_av_map), UCS_CONFIG_TYPE_BOOL},

    {"PREFER_NEAREST_DEVICE", "y",
     "Report a higher latency for a device attached to a NUMA node other than\n"
     "the one of the thread that opens the interface (found with hwloc), so\n"
     "that UCP prefers nearer devices.",
     ucs_offsetof(uct_usnic_md_config_t, prefer_nearest_device),
     UCS_CONFIG_TYPE_BOOL},

    {NULL}
};


static struct fi_info *uct_usnic_fi_hints(const char *provider,
                                          const char *domain_name)
{
    struct fi_info *hints;

    hints = fi_allocinfo();
    if (hints == NULL) {
        return NULL;
    }

    hints->caps                 = FI_MSG;
    /* Every posted operation carries a struct fi_context2, and receive
     * buffers have room for the headers usNIC writes in front of each
     * message */
    hints->mode                 = FI_CONTEXT | FI_CONTEXT2 | FI_MSG_PREFIX;
    hints->addr_format          = FI_SOCKADDR_IN;
    hints->ep_attr->type        = FI_EP_DGRAM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED |
                                  FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    /* The usnic provider offers FI_AV_MAP only, others FI_AV_TABLE */
    hints->domain_attr->av_type = FI_AV_UNSPEC;

    if (provider != NULL) {
        hints->fabric_attr->prov_name = strdup(provider);
        if (hints->fabric_attr->prov_name == NULL) {
            goto err_free;
        }
    }

    if (domain_name != NULL) {
        hints->domain_attr->name = strdup(domain_name);
        if (hints->domain_attr->name == NULL) {
            goto err_free;
        }
    }

    return hints;

err_free:
    fi_freeinfo(hints);
    return NULL;
}

/* Names of the providers that offer datagram endpoints, for error messages */
static void uct_usnic_dgram_providers(char *buf, size_t max)
{
    struct fi_info *hints, *list, *info;
    char *p;
    int ret;

    ucs_strncpy_safe(buf, "none", max);

    hints = uct_usnic_fi_hints(NULL, NULL);
    if (hints == NULL) {
        return;
    }

    ret = fi_getinfo(UCT_USNIC_FI_VERSION, NULL, NULL, 0, hints, &list);
    fi_freeinfo(hints);
    if (ret != 0) {
        return;
    }

    p  = buf;
    *p = '\0';
    for (info = list; info != NULL; info = info->next) {
        if (strstr(buf, info->fabric_attr->prov_name) == NULL) {
            snprintf(p, buf + max - p, "%s%s", (p == buf) ? "" : ",",
                     info->fabric_attr->prov_name);
            p += strlen(p);
        }
    }

    fi_freeinfo(list);
}

static ucs_status_t
uct_usnic_fi_getinfo_provider(const char *provider, const char *domain_name,
                              struct fi_info **info_p)
{
    struct fi_info *hints, *list, *info;
    int ret;

    hints = uct_usnic_fi_hints(provider, domain_name);
    if (hints == NULL) {
        ucs_error("failed to allocate libfabric hints");
        return UCS_ERR_NO_MEMORY;
    }

    ret = fi_getinfo(UCT_USNIC_FI_VERSION, NULL, NULL, 0, hints, &list);
    fi_freeinfo(hints);
    if (ret == -FI_ENODATA) {
        return UCS_ERR_NO_DEVICE;
    } else if (ret != 0) {
        ucs_error("fi_getinfo(provider %s) failed: %s", provider,
                  fi_strerror(-ret));
        return UCS_ERR_IO_ERROR;
    }

    if (domain_name == NULL) {
        *info_p = list;
        return UCS_OK;
    }

    /* Providers may treat the domain name as a hint only */
    for (info = list; info != NULL; info = info->next) {
        if (!strcmp(info->domain_attr->name, domain_name)) {
            break;
        }
    }

    *info_p = (info == NULL) ? NULL : fi_dupinfo(info);
    fi_freeinfo(list);
    return (*info_p == NULL) ? UCS_ERR_NO_DEVICE : UCS_OK;
}

/*
 * Find the DGRAM domains of the configured provider (all of them, or the one
 * named domain_name). With "auto", usnic hardware where libfabric finds it,
 * else the kernel's sockets: faster than libfabric's portable udp provider,
 * which makes a system call per datagram.
 */
static ucs_status_t uct_usnic_fi_getinfo(const char *provider,
                                         const char *domain_name,
                                         struct fi_info **info_p)
{
    char available[128];
    ucs_status_t status;

    if (!strcmp(provider, UCT_USNIC_PROVIDER_AUTO)) {
        status = uct_usnic_fi_getinfo_provider(UCT_USNIC_PROVIDER_USNIC,
                                               domain_name, info_p);
        if (status != UCS_ERR_NO_DEVICE) {
            return status;
        }

        ucs_debug("libfabric provider usnic offers no datagram endpoints%s%s",
                  (domain_name != NULL) ? " on " : "",
                  (domain_name != NULL) ? domain_name : "");
        provider = UCT_USNIC_PROVIDER_KERNEL;
    }

    if (!strcmp(provider, UCT_USNIC_PROVIDER_KERNEL)) {
        return uct_usnic_sock_getinfo(domain_name, info_p);
    }

    status = uct_usnic_fi_getinfo_provider(provider, domain_name, info_p);
    if (status == UCS_ERR_NO_DEVICE) {
        uct_usnic_dgram_providers(available, sizeof(available));
        ucs_error("UCX_USNIC_PROVIDER=%s: libfabric %u.%u has no such "
                  "provider offering FI_EP_DGRAM with IPv4 addresses%s%s "
                  "(providers with datagram endpoints: %s; built in: %s)",
                  provider, FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
                  (domain_name != NULL) ? " on " : "",
                  (domain_name != NULL) ? domain_name : "", available,
                  UCT_USNIC_PROVIDER_KERNEL);
    }
    return status;
}

/*
 * The index-th domain of a getinfo list, counting each domain once whatever
 * the number of fabrics, and skipping names too long for a device. Its MD is
 * named after the provider and the index ("kernel_0"): the device carries the
 * domain's name, and ucx_info -d so tells which provider runs each device.
 */
static const struct fi_info *uct_usnic_fi_domain(const struct fi_info *list,
                                                 unsigned index, char *md_name)
{
    const struct fi_info *info, *prev;
    unsigned count = 0;
    const char *name;

    for (info = list; info != NULL; info = info->next) {
        name = info->domain_attr->name;
        for (prev = list; prev != info; prev = prev->next) {
            if (!strcmp(prev->domain_attr->name, name)) {
                break;
            }
        }

        if (prev != info) {
            continue;
        } else if (strlen(name) >= UCT_DEVICE_NAME_MAX) {
            ucs_debug("skipping libfabric domain %s: name too long", name);
        } else if (count++ == index) {
            ucs_snprintf_zero(md_name, UCT_MD_NAME_MAX, "%s_%u",
                              info->fabric_attr->prov_name, index);
            return info;
        }
    }

    return NULL;
}

static ucs_status_t
uct_usnic_query_md_resources(uct_component_t *component,
                             uct_md_resource_desc_t **resources_p,
                             unsigned *num_resources_p)
{
    uct_md_resource_desc_t *resources = NULL;
    unsigned num_resources            = 0;
    char md_name[UCT_MD_NAME_MAX];
    uct_usnic_md_config_t *md_config;
    struct fi_info *list;
    ucs_status_t status;

    status = uct_md_config_read(component, NULL, NULL,
                                (uct_md_config_t**)&md_config);
    if (status != UCS_OK) {
        return status;
    }

    status = uct_usnic_fi_getinfo(md_config->provider, NULL, &list);
    uct_config_release(md_config);
    if (status == UCS_ERR_NO_DEVICE) {
        return uct_md_query_empty_md_resource(resources_p, num_resources_p);
    } else if (status != UCS_OK) {
        return status;
    }

    while (uct_usnic_fi_domain(list, num_resources, md_name) != NULL) {
        resources = ucs_realloc(resources,
                                sizeof(*resources) * (num_resources + 1),
                                "usnic_md_resources");
        if (resources == NULL) {
            fi_freeinfo(list);
            ucs_error("failed to allocate usnic MD resources");
            return UCS_ERR_NO_MEMORY;
        }

        ucs_strncpy_zero(resources[num_resources++].md_name, md_name,
                         UCT_MD_NAME_MAX);
    }

    fi_freeinfo(list);
    *resources_p     = resources;
    *num_resources_p = num_resources;
    return UCS_OK;
}

static ucs_status_t uct_usnic_md_query(uct_md_h uct_md,
                                       uct_md_attr_v2_t *md_attr)
{
    uct_md_base_md_query(md_attr);
    md_attr->flags            = UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_RKEY;
    /* The MD allocates nothing itself, but sets no limit on what
     * uct_iface_mem_alloc() allocates elsewhere and registers here */
    md_attr->max_alloc        = SIZE_MAX;
    md_attr->reg_mem_types    = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    /* A registration is a table entry, valid while the memory is mapped:
     * UCP may cache it (and its zero-copy protocols require that) */
    md_attr->cache_mem_types  = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    md_attr->access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    md_attr->reg_cost         = ucs_linear_func_make(1e-7, 0);
    md_attr->rkey_packed_size = sizeof(uct_usnic_rkey_t);
    return UCS_OK;
}
UCT_USNIC_MD_QUERY_ADAPTER(uct_usnic_md_query)

uint64_t uct_usnic_hash_seed;

ucs_status_t uct_usnic_random(void *buf, size_t length)
{
    ssize_t ret;

    do {
        ret = getrandom(buf, length, 0);
    } while ((ret < 0) && (errno == EINTR));

    if (ret != (ssize_t)length) {
        ucs_error("usnic: cannot read %zu random bytes from the kernel: %m",
                  length);
        return UCS_ERR_IO_ERROR;
    }

    return UCS_OK;
}

/* Register memory the provider sends from or receives into (FI_MR_LOCAL).
 * A provider that does not pick keys itself wants a distinct one each. */
static ucs_status_t uct_usnic_md_local_reg(uct_usnic_md_t *md, void *address,
                                           size_t length, struct fid_mr **mr_p)
{
    uint64_t key = ucs_atomic_fadd64(&md->next_mr_key, 1);
    int ret;

    ret = fi_mr_reg(md->domain, address, length, FI_SEND | FI_RECV, 0, key, 0,
                    mr_p, NULL);
    if (ret != 0) {
        ucs_error("fi_mr_reg(%s, address %p, %zu bytes) failed: %s",
                  md->info->domain_attr->name, address, length,
                  fi_strerror(-ret));
        return UCS_ERR_IO_ERROR;
    }

    return UCS_OK;
}

static ucs_status_t
uct_usnic_mem_reg(uct_md_h uct_md, void *address, size_t length,
                  const uct_md_mem_reg_params_t *params, uct_mem_h *memh_p)
{
    uct_usnic_md_t *md = ucs_derived_of(uct_md, uct_usnic_md_t);
    uint64_t flags     = UCT_MD_MEM_REG_FIELD_VALUE(params, flags,
                                                    FIELD_FLAGS, 0);
    uct_usnic_memh_t *memh;
    ucs_status_t status;
    uint64_t secret;

    /* A peer must not be able to guess it */
    status = uct_usnic_random(&secret, sizeof(secret));
    if (status != UCS_OK) {
        return status;
    }

    memh = ucs_malloc(sizeof(*memh), "usnic_memh");
    if (memh == NULL) {
        ucs_error("failed to allocate usnic memory handle");
        return UCS_ERR_NO_MEMORY;
    }

    memh->address      = address;
    memh->length       = length;
    memh->mr           = NULL;
    memh->remote_write = !!(flags & UCT_MD_MEM_ACCESS_REMOTE_PUT);
    memh->remote_read  = !!(flags & UCT_MD_MEM_ACCESS_REMOTE_GET);
    memh->rkey.secret  = secret;

    if (md->mr_local) {
        status = uct_usnic_md_local_reg(md, address, length, &memh->mr);
        if (status != UCS_OK) {
            ucs_free(memh);
            return status;
        }
    }

    ucs_spin_lock(&md->regs_lock);
    memh->rkey.id = ucs_ptr_array_insert(&md->regs, memh);
    ucs_spin_unlock(&md->regs_lock);

    *memh_p = memh;
    return UCS_OK;
}
UCT_USNIC_MEM_REG_ADAPTER(uct_usnic_mem_reg)

static ucs_status_t
uct_usnic_mem_dereg(uct_md_h uct_md, const uct_md_mem_dereg_params_t *params)
{
    uct_usnic_md_t *md = ucs_derived_of(uct_md, uct_usnic_md_t);
    uct_usnic_memh_t *memh, *found;
    int ret;

    UCT_MD_MEM_DEREG_CHECK_PARAMS(params, 0);

    memh = params->memh;
    ucs_spin_lock(&md->regs_lock);
    if (!ucs_ptr_array_lookup(&md->regs, memh->rkey.id, found) ||
        (found != memh)) {
        ucs_spin_unlock(&md->regs_lock);
        ucs_error("usnic md %s: %p is not a registration of this MD",
                  md->info->domain_attr->name, memh);
        return UCS_ERR_INVALID_PARAM;
    }

    /* From here on no remote write can reach the region */
    ucs_ptr_array_remove(&md->regs, memh->rkey.id);
    ucs_spin_unlock(&md->regs_lock);

    if (memh->mr != NULL) {
        ret = fi_close(&memh->mr->fid);
        if (ret != 0) {
            ucs_warn("fi_close(mr %p) failed: %s", memh->mr,
                     fi_strerror(-ret));
        }
    }

    ucs_free(memh);
    return UCS_OK;
}

static ucs_status_t
uct_usnic_mkey_pack(uct_md_h uct_md, uct_mem_h memh, void *address,
                    size_t length, const uct_md_mkey_pack_params_t *params,
                    void *buffer)
{
    memcpy(buffer, &((uct_usnic_memh_t*)memh)->rkey, sizeof(uct_usnic_rkey_t));
    return UCS_OK;
}
UCT_USNIC_MKEY_PACK_ADAPTER(uct_usnic_mkey_pack)

static ucs_status_t
uct_usnic_rkey_unpack(uct_component_t *component, const void *buffer,
                      const uct_rkey_unpack_params_t *params,
                      uct_rkey_t *rkey_p, void **handle_p)
{
    uct_usnic_rkey_t *rkey;

    rkey = ucs_malloc(sizeof(*rkey), "usnic_rkey");
    if (rkey == NULL) {
        ucs_error("failed to allocate usnic remote key");
        return UCS_ERR_NO_MEMORY;
    }

    memcpy(rkey, buffer, sizeof(*rkey));
    *rkey_p   = (uintptr_t)rkey;
    *handle_p = rkey;
    return UCS_OK;
}
UCT_USNIC_RKEY_UNPACK_ADAPTER(uct_usnic_rkey_unpack)

static ucs_status_t uct_usnic_rkey_release(uct_component_t *component,
                                           uct_rkey_t rkey, void *handle)
{
    ucs_free(handle);
    return UCS_OK;
}

/* Whether rkey grants the access to all of [address, address + length);
 * called with the registrations locked */
static uct_usnic_md_access_result_t
uct_usnic_md_check(uct_usnic_md_t *md, const uct_usnic_rkey_t *rkey,
                   int write, uint64_t address, size_t length)
{
    uct_usnic_memh_t *memh;
    uint64_t start;

    if (!ucs_ptr_array_lookup(&md->regs, rkey->id, memh) ||
        (memh->rkey.secret != rkey->secret) ||
        !(write ? memh->remote_write : memh->remote_read)) {
        return UCT_USNIC_MD_ACCESS_BAD_KEY;
    }

    start = (uintptr_t)memh->address;
    if ((address < start) || (length > memh->length) ||
        ((address - start) > (memh->length - length))) {
        return UCT_USNIC_MD_ACCESS_BAD_RANGE;
    }

    return UCT_USNIC_MD_ACCESS_OK;
}

/*
 * Apply one datagram of a peer's write of [address, address + length), of
 * which data is the part at offset. The whole range is checked, so that a
 * write that is refused is refused for every one of its datagrams. The lock
 * makes mem_dereg wait for a write in progress.
 */
uct_usnic_md_access_result_t
uct_usnic_md_write(uct_usnic_md_t *md, const uct_usnic_rkey_t *rkey,
                   uint64_t address, size_t length, size_t offset,
                   const void *data, size_t data_length)
{
    uct_usnic_md_access_result_t result;

    ucs_assert((offset <= length) && (data_length <= (length - offset)));

    ucs_spin_lock(&md->regs_lock);
    result = uct_usnic_md_check(md, rkey, 1, address, length);
    if (result == UCT_USNIC_MD_ACCESS_OK) {
        memcpy((void*)(uintptr_t)(address + offset), data, data_length);
    }
    ucs_spin_unlock(&md->regs_lock);
    return result;
}

uct_usnic_md_access_result_t
uct_usnic_md_read_begin(uct_usnic_md_t *md, const uct_usnic_rkey_t *rkey,
                        uint64_t address, size_t length)
{
    uct_usnic_md_access_result_t result;

    ucs_spin_lock(&md->regs_lock);
    result = uct_usnic_md_check(md, rkey, 0, address, length);
    if (result != UCT_USNIC_MD_ACCESS_OK) {
        ucs_spin_unlock(&md->regs_lock);
    }
    return result;
}

void uct_usnic_md_read_end(uct_usnic_md_t *md)
{
    ucs_spin_unlock(&md->regs_lock);
}

static void uct_usnic_md_close_domain(uct_usnic_md_t *md)
{
    int ret;

    if (md->kernel) {
        return;
    }

    ret = fi_close(&md->domain->fid);
    if (ret != 0) {
        ucs_warn("fi_close(domain %s) failed: %s", md->info->domain_attr->name,
                 fi_strerror(-ret));
    }

    ret = fi_close(&md->fabric->fid);
    if (ret != 0) {
        ucs_warn("fi_close(fabric %s) failed: %s", md->info->fabric_attr->name,
                 fi_strerror(-ret));
    }
}

static void uct_usnic_md_close(uct_md_h uct_md)
{
    uct_usnic_md_t *md = ucs_derived_of(uct_md, uct_usnic_md_t);

    uct_usnic_md_close_domain(md);
    ucs_ptr_array_cleanup(&md->regs, 1);
    ucs_spinlock_destroy(&md->regs_lock);
    uct_usnic_topo_dev_cleanup(&md->topo);
    fi_freeinfo(md->info);
    ucs_free(md);
}

static uct_md_ops_t uct_usnic_md_ops = {
    .close              = uct_usnic_md_close,
    .query              = UCT_USNIC_MD_QUERY(uct_usnic_md_query),
    .mem_alloc          = (uct_md_mem_alloc_func_t)
            ucs_empty_function_return_unsupported,
    .mem_free           = (uct_md_mem_free_func_t)
            ucs_empty_function_return_unsupported,
    .mem_advise         = (uct_md_mem_advise_func_t)
            ucs_empty_function_return_unsupported,
    .mem_reg            = UCT_USNIC_MEM_REG(uct_usnic_mem_reg),
    .mem_dereg          = uct_usnic_mem_dereg,
    .mem_query          = (uct_md_mem_query_func_t)
            ucs_empty_function_return_unsupported,
    .mkey_pack          = UCT_USNIC_MKEY_PACK(uct_usnic_mkey_pack),
    .detect_memory_type = (uct_md_detect_memory_type_func_t)
            ucs_empty_function_return_unsupported,
    UCT_USNIC_MD_OPS_VERSIONED
};

/* Open libfabric's fabric and domain; the kernel provider needs neither */
static ucs_status_t uct_usnic_md_open_domain(uct_usnic_md_t *md)
{
    int ret;

    if (md->kernel) {
        return UCS_OK;
    }

    ret = fi_fabric(md->info->fabric_attr, &md->fabric, NULL);
    if (ret != 0) {
        ucs_error("fi_fabric(%s) failed: %s", md->info->fabric_attr->name,
                  fi_strerror(-ret));
        return UCS_ERR_IO_ERROR;
    }

    ret = fi_domain(md->fabric, md->info, &md->domain, NULL);
    if (ret != 0) {
        ucs_error("fi_domain(%s) failed: %s", md->info->domain_attr->name,
                  fi_strerror(-ret));
        fi_close(&md->fabric->fid);
        return UCS_ERR_IO_ERROR;
    }

    return UCS_OK;
}

/*
 * What only the usnic provider's extension tells: the VIC's link speed and
 * subnet, for iface_query and reachability (its domains are named after the
 * VIC, not after a netdev that sysfs would know).
 */
static void uct_usnic_md_query_usnic_ext(uct_usnic_md_t *md)
{
#if HAVE_USNIC_FI_EXT
    struct fi_usnic_ops_fabric *ops;
    struct fi_usnic_info info;
    int ret;

    if (strcmp(md->info->fabric_attr->prov_name, UCT_USNIC_PROVIDER_USNIC)) {
        return;
    }

    ret = fi_open_ops(&md->fabric->fid, FI_USNIC_FABRIC_OPS_1, 0,
                      (void**)&ops, NULL);
    if (ret != 0) {
        ucs_debug("fi_open_ops(%s, %s) failed: %s",
                  md->info->fabric_attr->name, FI_USNIC_FABRIC_OPS_1,
                  fi_strerror(-ret));
        return;
    }

    ret = ops->getinfo(1, md->fabric, &info);
    if (ret != 0) {
        ucs_debug("usnic getinfo(%s) failed: %s", md->info->fabric_attr->name,
                  fi_strerror(-ret));
        return;
    }

    md->link_speed = info.ui.v1.ui_link_speed * 1e6;
    md->prefix_len = ucs_popcount(info.ui.v1.ui_netmask_be);
    ucs_debug("usnic md %s: VIC %.*s, link %u Mb/s, /%u",
              md->info->domain_attr->name, (int)sizeof(info.ui.v1.ui_ifname),
              info.ui.v1.ui_ifname, info.ui.v1.ui_link_speed, md->prefix_len);
#endif
}

/* The domain of the MD named md_name, as uct_usnic_query_md_resources
 * named it */
static ucs_status_t uct_usnic_md_getinfo(const char *provider,
                                         const char *md_name,
                                         struct fi_info **info_p)
{
    char domain[UCT_DEVICE_NAME_MAX], name[UCT_MD_NAME_MAX];
    const struct fi_info *info;
    struct fi_info *list;
    ucs_status_t status;
    unsigned index;

    status = uct_usnic_fi_getinfo(provider, NULL, &list);
    if (status != UCS_OK) {
        return status;
    }

    for (index = 0; (info = uct_usnic_fi_domain(list, index, name)) != NULL;
         ++index) {
        if (!strcmp(name, md_name)) {
            break;
        }
    }

    if (info == NULL) {
        fi_freeinfo(list);
        ucs_error("usnic: no memory domain %s with UCX_USNIC_PROVIDER=%s",
                  md_name, provider);
        return UCS_ERR_NO_DEVICE;
    }

    ucs_strncpy_zero(domain, info->domain_attr->name, sizeof(domain));
    fi_freeinfo(list);
    status = uct_usnic_fi_getinfo(provider, domain, info_p);
    if (status == UCS_ERR_NO_DEVICE) {
        ucs_error("usnic: datagram domain %s (provider %s) is gone", domain,
                  provider);
    }
    return status;
}

/* How the provider wants buffers and addresses handed to it, or how the
 * test switches make any libfabric provider want them */
static ucs_status_t
uct_usnic_md_init_modes(uct_usnic_md_t *md,
                        const uct_usnic_md_config_t *md_config)
{
    struct fi_domain_attr *domain_attr = md->info->domain_attr;

    if (md->kernel && (md_config->force_mr_local || md_config->force_av_map)) {
        ucs_error("%sUSNIC_FORCE_%s=y: a test switch for libfabric providers; "
                  "the %s provider takes neither registrations nor an "
                  "address vector", UCS_DEFAULT_ENV_PREFIX,
                  md_config->force_mr_local ? "MR_LOCAL" : "AV_MAP",
                  UCT_USNIC_PROVIDER_KERNEL);
        return UCS_ERR_INVALID_PARAM;
    }

    md->force_mr_local = md_config->force_mr_local;
    md->mr_local       = (domain_attr->mr_mode & FI_MR_LOCAL) ||
                         md_config->force_mr_local;
    md->link_speed     = 0;
    md->prefix_len     = UCT_USNIC_PREFIX_LEN_UNKNOWN;
    /* The domain opens with the type its address vectors will have */
    if (md_config->force_av_map) {
        domain_attr->av_type = FI_AV_MAP;
    } else if (domain_attr->av_type == FI_AV_UNSPEC) {
        domain_attr->av_type = FI_AV_TABLE;
    }
    return UCS_OK;
}

static ucs_status_t
uct_usnic_md_open(uct_component_t *component, const char *md_name,
                  const uct_md_config_t *uct_md_config, uct_md_h *md_p)
{
    const uct_usnic_md_config_t *md_config =
            ucs_derived_of(uct_md_config, uct_usnic_md_config_t);
    static ucs_init_once_t seed_once = UCS_INIT_ONCE_INITIALIZER;
    uct_usnic_md_t *md;
    ucs_status_t status = UCS_OK;

    UCS_INIT_ONCE(&seed_once) {
        status = uct_usnic_random(&uct_usnic_hash_seed,
                                  sizeof(uct_usnic_hash_seed));
    }
    if (status != UCS_OK) {
        return status;
    }

    md = ucs_calloc(1, sizeof(*md), "usnic_md");
    if (md == NULL) {
        ucs_error("failed to allocate usnic MD");
        return UCS_ERR_NO_MEMORY;
    }

    status = uct_usnic_md_getinfo(md_config->provider, md_name, &md->info);
    if (status != UCS_OK) {
        goto err_free_md;
    }

    md->kernel = !strcmp(md->info->fabric_attr->prov_name,
                         UCT_USNIC_PROVIDER_KERNEL);
    status     = uct_usnic_md_init_modes(md, md_config);
    if (status != UCS_OK) {
        goto err_free_info;
    }

    status = uct_usnic_md_open_domain(md);
    if (status != UCS_OK) {
        goto err_free_info;
    }

    status = ucs_spinlock_init(&md->regs_lock, 0);
    if (status != UCS_OK) {
        goto err_close_domain;
    }

    ucs_ptr_array_init(&md->regs, "usnic_regs");
    uct_usnic_md_query_usnic_ext(md);
    uct_usnic_topo_dev_init(&md->topo, md->info);
    md->prefer_nearest_device = md_config->prefer_nearest_device;
    md->super.ops        = &uct_usnic_md_ops;
    md->super.component  = &uct_usnic_component;
    *md_p                = &md->super;

    ucs_debug("usnic md %s: provider %s fabric %s domain %s", md_name,
              md->info->fabric_attr->prov_name, md->info->fabric_attr->name,
              md->info->domain_attr->name);
    return UCS_OK;

err_close_domain:
    uct_usnic_md_close_domain(md);
err_free_info:
    fi_freeinfo(md->info);
err_free_md:
    ucs_free(md);
    return status;
}

/* Chunk of a buffer pool, registered as a whole where the provider needs
 * local registration */
typedef struct uct_usnic_chunk_hdr {
    struct fid_mr *mr;
} UCS_V_ALIGNED(UCS_SYS_CACHE_LINE_SIZE) uct_usnic_chunk_hdr_t;


typedef struct uct_usnic_mpool_priv {
    uct_usnic_md_t             *md;
    uct_usnic_mpool_obj_init_t obj_init;
} uct_usnic_mpool_priv_t;


static ucs_status_t uct_usnic_mpool_chunk_alloc(ucs_mpool_t *mp,
                                                size_t *size_p,
                                                void **chunk_p)
{
    uct_usnic_mpool_priv_t *priv = ucs_mpool_priv(mp);
    size_t size                  = sizeof(uct_usnic_chunk_hdr_t) + *size_p;
    uct_usnic_chunk_hdr_t *hdr;
    ucs_status_t status;
    int ret;

    ret = ucs_posix_memalign((void**)&hdr, UCS_SYS_CACHE_LINE_SIZE, size,
                             ucs_mpool_name(mp));
    if (ret != 0) {
        ucs_error("failed to allocate %zu bytes for %s", size,
                  ucs_mpool_name(mp));
        return UCS_ERR_NO_MEMORY;
    }

    hdr->mr = NULL;
    if (priv->md->mr_local) {
        status = uct_usnic_md_local_reg(priv->md, hdr, size, &hdr->mr);
        if (status != UCS_OK) {
            ucs_free(hdr);
            return status;
        }
    }

    *chunk_p = hdr + 1;
    *size_p  = size - sizeof(*hdr);
    return UCS_OK;
}

static void uct_usnic_mpool_chunk_release(ucs_mpool_t *mp, void *chunk)
{
    uct_usnic_chunk_hdr_t *hdr = (uct_usnic_chunk_hdr_t*)chunk - 1;

    if (hdr->mr != NULL) {
        fi_close(&hdr->mr->fid);
    }
    ucs_free(hdr);
}

static void uct_usnic_mpool_obj_init(ucs_mpool_t *mp, void *obj, void *chunk)
{
    uct_usnic_mpool_priv_t *priv = ucs_mpool_priv(mp);
    uct_usnic_chunk_hdr_t *hdr   = (uct_usnic_chunk_hdr_t*)chunk - 1;

    if (priv->obj_init != NULL) {
        priv->obj_init(obj, (hdr->mr == NULL) ? NULL : fi_mr_desc(hdr->mr));
    }
}

static ucs_mpool_ops_t uct_usnic_mpool_ops = {
    .chunk_alloc   = uct_usnic_mpool_chunk_alloc,
    .chunk_release = uct_usnic_mpool_chunk_release,
    .obj_init      = uct_usnic_mpool_obj_init,
    .obj_cleanup   = NULL,
    .obj_str       = NULL
};

ucs_status_t uct_usnic_md_mpool_init(uct_usnic_md_t *md, ucs_mpool_t *mp,
                                     size_t elem_size, size_t align_offset,
                                     size_t alignment,
                                     const uct_iface_mpool_config_t *config,
                                     unsigned grow,
                                     uct_usnic_mpool_obj_init_t obj_init,
                                     const char *name)
{
    uct_usnic_mpool_priv_t *priv;
    ucs_status_t status;

    status = uct_usnic_mpool_init(mp, sizeof(*priv), elem_size, align_offset,
                                  alignment, config, grow,
                                  &uct_usnic_mpool_ops, name);
    if (status != UCS_OK) {
        return status;
    }

    priv           = ucs_mpool_priv(mp);
    priv->md       = md;
    priv->obj_init = obj_init;
    return UCS_OK;
}

ucs_status_t uct_usnic_md_query_devices(uct_md_h uct_md,
                                        uct_tl_device_resource_t **devices_p,
                                        unsigned *num_devices_p)
{
    uct_usnic_md_t *md = ucs_derived_of(uct_md, uct_usnic_md_t);

    return uct_single_device_resource(uct_md, md->info->domain_attr->name,
                                      UCT_DEVICE_TYPE_NET,
                                      md->topo.sys_device, devices_p,
                                      num_devices_p);
}

uct_component_t uct_usnic_component = {
    .query_md_resources = uct_usnic_query_md_resources,
    .md_open            = uct_usnic_md_open,
    .cm_open            = (uct_component_cm_open_func_t)
            ucs_empty_function_return_unsupported,
    .rkey_unpack        = UCT_USNIC_RKEY_UNPACK(uct_usnic_rkey_unpack),
    .rkey_ptr           = (uct_component_rkey_ptr_func_t)
            ucs_empty_function_return_unsupported,
    .rkey_release       = uct_usnic_rkey_release,
    UCT_USNIC_COMPONENT_RKEY_COMPARE
    .name               = "usnic",
    .md_config          = {
        .name           = "usnic memory domain",
        .prefix         = "USNIC_",
        .table          = uct_usnic_md_config_table,
        .size           = sizeof(uct_usnic_md_config_t),
    },
    .cm_config          = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(
                                  &uct_usnic_component),
    .flags              = 0,
    .md_vfs_init        = (uct_component_md_vfs_init_func_t)
            ucs_empty_function
};
