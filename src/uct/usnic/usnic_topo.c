/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "usnic_topo.h"

#include <ucs/debug/log.h>
#include <ucs/sys/math.h>
#include <ucs/sys/string.h>
#include <ucs/sys/sys.h>

#include <hwloc/glibc-sched.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>


/* Latency estimate for a far device, as UCX's InfiniBand transports make
 * it: per unit of NUMA distance above the local distance, or a fixed
 * amount when the machine reports no distances */
#define UCT_USNIC_TOPO_LOCAL_DISTANCE   10
#define UCT_USNIC_TOPO_UNIT_LATENCY     20e-9
#define UCT_USNIC_TOPO_FAR_LATENCY      200e-9


/*
 * One topology for the whole process, kept after the last MD closes:
 * loading it takes tens of milliseconds (every PCI function is read from
 * sysfs, hwloc's plugins are loaded again), and UCP and ucx_info open and
 * close MDs many times. It is loaded again only while no MD uses it, and
 * only if hwloc would now read another source (HWLOC_XMLFILE).
 */
static struct {
    pthread_mutex_t  lock;
    unsigned         refcount; /* MDs using the topology */
    int              loaded;
    hwloc_topology_t topology; /* NULL if hwloc could not load it */
    char             source[PATH_MAX]; /* HWLOC_XMLFILE then, or "" */
} uct_usnic_topo = {
    .lock     = PTHREAD_MUTEX_INITIALIZER,
    .refcount = 0,
    .loaded   = 0,
    .topology = NULL
};


static hwloc_topology_t uct_usnic_topo_load(void)
{
    hwloc_topology_t topology;

    if (hwloc_topology_init(&topology) != 0) {
        ucs_debug("usnic: hwloc_topology_init() failed: %m");
        return NULL;
    }

#if HWLOC_API_VERSION >= 0x00020100
    /* Linux's sysfs gives hwloc the PCI functions as well; its libpciaccess
     * component adds nothing here, and leaks what it allocates */
    hwloc_topology_set_components(topology,
                                  HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                  "pci");
#endif

    /* PCI functions and their network interfaces are what we look for */
    if ((hwloc_topology_set_io_types_filter(
                 topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) ||
        (hwloc_topology_load(topology) != 0)) {
        ucs_debug("usnic: hwloc failed to load the topology: %m");
        hwloc_topology_destroy(topology);
        return NULL;
    }

    return topology;
}

static void uct_usnic_topo_unload(void)
{
    if (uct_usnic_topo.topology != NULL) {
        hwloc_topology_destroy(uct_usnic_topo.topology);
        uct_usnic_topo.topology = NULL;
    }
    uct_usnic_topo.loaded = 0;
}

static hwloc_topology_t uct_usnic_topo_get(void)
{
    const char *source = getenv("HWLOC_XMLFILE");
    hwloc_topology_t topology;

    if (source == NULL) {
        source = "";
    }

    pthread_mutex_lock(&uct_usnic_topo.lock);
    if ((uct_usnic_topo.refcount++ == 0) &&
        (!uct_usnic_topo.loaded || strcmp(source, uct_usnic_topo.source))) {
        uct_usnic_topo_unload();
        uct_usnic_topo.topology = uct_usnic_topo_load();
        uct_usnic_topo.loaded   = 1;
        ucs_strncpy_zero(uct_usnic_topo.source, source,
                         sizeof(uct_usnic_topo.source));
        ucs_debug("usnic: hwloc topology loaded from %s",
                  (*source != '\0') ? source : "this machine");
    }
    topology = uct_usnic_topo.topology;
    pthread_mutex_unlock(&uct_usnic_topo.lock);
    return topology;
}

static void uct_usnic_topo_put(void)
{
    pthread_mutex_lock(&uct_usnic_topo.lock);
    ucs_assert(uct_usnic_topo.refcount > 0);
    --uct_usnic_topo.refcount;
    pthread_mutex_unlock(&uct_usnic_topo.lock);
}

UCS_STATIC_CLEANUP {
    uct_usnic_topo_unload();
}

static hwloc_obj_t uct_usnic_topo_find_pci_dev(hwloc_topology_t topology,
                                               const struct fi_info *info)
{
    const struct fi_pci_attr *pci;
    hwloc_obj_t osdev;

    if ((info->nic != NULL) && (info->nic->bus_attr != NULL) &&
        (info->nic->bus_attr->bus_type == FI_BUS_PCI)) {
        pci = &info->nic->bus_attr->attr.pci;
        return hwloc_get_pcidev_by_busid(topology, pci->domain_id,
                                         pci->bus_id, pci->device_id,
                                         pci->function_id);
    }

    for (osdev = hwloc_get_next_osdev(topology, NULL); osdev != NULL;
         osdev = hwloc_get_next_osdev(topology, osdev)) {
        if ((osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) &&
            (osdev->parent->type == HWLOC_OBJ_PCI_DEVICE) &&
            !strcmp(osdev->name, info->domain_attr->name)) {
            return osdev->parent;
        }
    }

    return NULL;
}

void uct_usnic_topo_dev_init(uct_usnic_topo_dev_t *dev,
                             const struct fi_info *info)
{
    hwloc_topology_t topology = uct_usnic_topo_get();
    const struct hwloc_pcidev_attr_s *pci;
    ucs_sys_bus_id_t bus_id;
    ucs_status_t status;

    dev->pci_dev    = (topology == NULL) ? NULL :
                      uct_usnic_topo_find_pci_dev(topology, info);
    dev->sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
    if (dev->pci_dev == NULL) {
        ucs_debug("usnic: %s: no PCI function found, no locality",
                  info->domain_attr->name);
        return;
    }

    pci             = &dev->pci_dev->attr->pcidev;
    bus_id.domain   = pci->domain;
    bus_id.bus      = pci->bus;
    bus_id.slot     = pci->dev;
    bus_id.function = pci->func;
    status          = ucs_topo_find_device_by_bus_id(&bus_id,
                                                     &dev->sys_device);
    if (status != UCS_OK) {
        dev->sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
    }

    ucs_debug("usnic: %s: PCI %04x:%02x:%02x.%x, system device %u",
              info->domain_attr->name, pci->domain, pci->bus, pci->dev,
              pci->func, dev->sys_device);
}

void uct_usnic_topo_dev_cleanup(uct_usnic_topo_dev_t *dev)
{
    dev->pci_dev = NULL;
    uct_usnic_topo_put();
}

/* From the nearest NUMA node the thread may run on to the device's */
static double uct_usnic_topo_numa_latency(hwloc_topology_t topology,
                                          hwloc_const_cpuset_t cpuset,
                                          hwloc_const_nodeset_t dev_nodes)
{
    hwloc_uint64_t distance = UINT64_MAX;
    struct hwloc_distances_s *distances;
    hwloc_uint64_t to_dev, from_dev;
    hwloc_obj_t first, node, dev_node;
    unsigned count = 1;

    if ((hwloc_distances_get_by_type(topology, HWLOC_OBJ_NUMANODE, &count,
                                     &distances,
                                     HWLOC_DISTANCES_KIND_MEANS_LATENCY,
                                     0) != 0) ||
        (count == 0)) {
        return UCT_USNIC_TOPO_FAR_LATENCY;
    }

    first = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, NULL);
    for (node = first; node != NULL; node = node->next_cousin) {
        if (!hwloc_bitmap_intersects(node->cpuset, cpuset)) {
            continue;
        }

        for (dev_node = first; dev_node != NULL;
             dev_node = dev_node->next_cousin) {
            if (hwloc_bitmap_isset(dev_nodes, dev_node->os_index) &&
                (hwloc_distances_obj_pair_values(distances, node, dev_node,
                                                 &to_dev, &from_dev) == 0)) {
                distance = ucs_min(distance, to_dev);
            }
        }
    }

    hwloc_distances_release(topology, distances);
    if ((distance == UINT64_MAX) ||
        (distance < UCT_USNIC_TOPO_LOCAL_DISTANCE)) {
        return UCT_USNIC_TOPO_FAR_LATENCY;
    }

    return (distance - UCT_USNIC_TOPO_LOCAL_DISTANCE) *
           UCT_USNIC_TOPO_UNIT_LATENCY;
}

double uct_usnic_topo_dev_latency(const uct_usnic_topo_dev_t *dev)
{
    /* The device's reference keeps the topology loaded */
    hwloc_topology_t topology = uct_usnic_topo.topology;
    ucs_sys_cpuset_t affinity;
    hwloc_bitmap_t cpuset;
    hwloc_obj_t local;
    double latency;

    if (dev->pci_dev == NULL) {
        return 0;
    }

    if (ucs_sys_getaffinity(&affinity) != 0) {
        ucs_debug("usnic: sched_getaffinity() failed: %m");
        return 0;
    }

    cpuset = hwloc_bitmap_alloc();
    if (cpuset == NULL) {
        return 0;
    }

    hwloc_cpuset_from_glibc_sched_affinity(topology, cpuset, &affinity,
                                           sizeof(affinity));
    local   = hwloc_get_non_io_ancestor_obj(topology, dev->pci_dev);
    latency = hwloc_bitmap_isincluded(cpuset, local->cpuset) ?
                      0 :
                      uct_usnic_topo_numa_latency(topology, cpuset,
                                                  local->nodeset);
    hwloc_bitmap_free(cpuset);
    return latency;
}
