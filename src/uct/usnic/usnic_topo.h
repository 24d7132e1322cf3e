/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_TOPO_H
#define UCT_USNIC_TOPO_H

#include <ucs/sys/topo/base/topo.h>
#include <ucs/type/status.h>

#include <hwloc.h>
#include <rdma/fabric.h>


/**
 * Where a device sits in the machine, found with hwloc. Virtual devices
 * (loopback, veth) have no PCI function, hence no locality: they keep
 * UCS_SYS_DEVICE_ID_UNKNOWN and no extra latency.
 */
typedef struct uct_usnic_topo_dev {
    hwloc_obj_t      pci_dev;    /* NULL when unknown */
    ucs_sys_device_t sys_device; /* The PCI function, registered with UCS */
} uct_usnic_topo_dev_t;


/*
 * Find the PCI function of the device described by info: the bus address
 * libfabric gives (usnic), else the network interface of that name. Holds
 * a reference to the process's topology until uct_usnic_topo_dev_cleanup.
 */
void uct_usnic_topo_dev_init(uct_usnic_topo_dev_t *dev,
                             const struct fi_info *info);


void uct_usnic_topo_dev_cleanup(uct_usnic_topo_dev_t *dev);


/*
 * Latency, in seconds, that reaching the device adds for the calling
 * thread: none from the device's own NUMA node or for a device of unknown
 * locality; from farther nodes, 20 nsec per unit of NUMA distance above
 * the local one, or 200 nsec when the machine gives no distances.
 */
double uct_usnic_topo_dev_latency(const uct_usnic_topo_dev_t *dev);

#endif
