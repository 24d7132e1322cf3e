/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 *
 * What an endpoint costs, measured through the public UCT API: opens two
 * usnic ifaces on one device, connects N endpoints from the first to the
 * second, sends one message on each and waits until all are acknowledged.
 * Prints the heap in use (malloc'd and mmap'd by malloc) per endpoint on
 * the sending side (the ep) and on the receiving side (its stream).
 * With -m, then sends M short messages round robin on the first ep alone
 * and on all N (each one in flight at once: every ep has datagrams waiting
 * for their ACK), and prints the time per message of each and the ratio.
 * Run it with UCX_USNIC_BUNDLE_DELAY=0, or one ep gains from bundles.
 *
 *   ep_scale [-d device] [-n endpoints] [-m messages]
 */

#include <uct/api/uct.h>
#include <ucs/async/async_fwd.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(_call) \
    do { \
        ucs_status_t _status = (_call); \
        if (_status != UCS_OK) { \
            fprintf(stderr, "ep_scale: %s: %s\n", #_call, \
                    ucs_status_string(_status)); \
            exit(1); \
        } \
    } while (0)

static size_t received;

static ucs_status_t am_cb(void *arg, void *data, size_t length,
                          unsigned flags)
{
    ++received;
    return UCS_OK;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();

    return mi.uordblks + mi.hblkhd;
}

static uct_iface_h iface_open(uct_md_h md, uct_worker_h worker,
                              const char *dev)
{
    uct_iface_params_t params = {0};
    uct_iface_config_t *config;
    uct_iface_h iface;

    params.field_mask           = UCT_IFACE_PARAM_FIELD_OPEN_MODE |
                                  UCT_IFACE_PARAM_FIELD_DEVICE |
                                  UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
    params.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    params.mode.device.tl_name  = "usnic";
    params.mode.device.dev_name = dev;
    params.rx_headroom          = 0;

    CHECK(uct_md_iface_config_read(md, "usnic", NULL, NULL, &config));
    CHECK(uct_iface_open(md, worker, &params, config, &iface));
    uct_config_release(config);
    return iface;
}

static void *address(uct_iface_h iface, size_t length,
                     ucs_status_t (*get)(uct_iface_h, void*))
{
    void *addr = malloc(length);

    CHECK(get(iface, addr));
    return addr;
}

static ucs_status_t get_dev_addr(uct_iface_h iface, void *addr)
{
    return uct_iface_get_device_address(iface, addr);
}

/* The usnic MD with the device: MDs are named after the provider, devices
 * after the interface */
static uct_md_h md_open(uct_component_h component, const char *dev)
{
    uct_component_attr_t attr = {0};
    uct_tl_resource_desc_t *tls;
    uct_md_config_t *md_config;
    unsigned i, j, num_tls;
    uct_md_h md;

    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    CHECK(uct_component_query(component, &attr));
    attr.md_resources = calloc(attr.md_resource_count,
                               sizeof(*attr.md_resources));
    attr.field_mask   = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    CHECK(uct_component_query(component, &attr));
    CHECK(uct_md_config_read(component, NULL, NULL, &md_config));

    for (i = 0; i < attr.md_resource_count; ++i) {
        CHECK(uct_md_open(component, attr.md_resources[i].md_name, md_config,
                          &md));
        CHECK(uct_md_query_tl_resources(md, &tls, &num_tls));
        for (j = 0; (j < num_tls) && strcmp(tls[j].dev_name, dev); ++j) {
        }
        uct_release_tl_resource_list(tls);
        if (j < num_tls) {
            break;
        }
        uct_md_close(md);
    }

    uct_config_release(md_config);
    free(attr.md_resources);
    if (i == attr.md_resource_count) {
        fprintf(stderr, "ep_scale: no usnic device %s\n", dev);
        exit(1);
    }
    return md;
}

static ucs_status_t get_iface_addr(uct_iface_h iface, void *addr)
{
    return uct_iface_get_address(iface, addr);
}

static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Seconds per message for count messages sent round robin on num_eps eps,
 * from the first post until the last is received and acknowledged */
static double send_round_robin(uct_worker_h worker, uct_ep_h *eps,
                               unsigned num_eps, size_t count)
{
    size_t target = received + count, i;
    double start  = now_sec();
    unsigned e;

    /* Progress after every post, as an application's send loop does: the
     * receiver (the same worker) takes each datagram as it comes */
    for (i = 0; i < count; ++i) {
        while (uct_ep_am_short(eps[i % num_eps], 0, i, NULL, 0) ==
               UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
        uct_worker_progress(worker);
    }
    while (received < target) {
        uct_worker_progress(worker);
    }
    for (e = 0; e < num_eps; ++e) {
        while (uct_ep_flush(eps[e], 0, NULL) != UCS_OK) {
            uct_worker_progress(worker);
        }
    }
    return (now_sec() - start) / count;
}

int main(int argc, char **argv)
{
    const char *dev = "lo";
    unsigned num_eps = 10000, i;
    size_t messages  = 0;
    double one, all;
    uct_component_h *components, component = NULL;
    unsigned num_components;
    ucs_async_context_t *async;
    uct_worker_h worker;
    uct_md_h md;
    uct_iface_h sender, receiver;
    uct_iface_attr_t attr;
    uct_ep_params_t ep_params = {0};
    uct_component_attr_t comp_attr = {0};
    uct_ep_h *eps;
    void *dev_addr, *iface_addr;
    size_t before, after_create, after_traffic;
    int c;

    while ((c = getopt(argc, argv, "d:n:m:")) != -1) {
        switch (c) {
        case 'd': dev = optarg; break;
        case 'n': num_eps = strtoul(optarg, NULL, 0); break;
        case 'm': messages = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: %s [-d device] [-n endpoints] "
                    "[-m messages]\n", argv[0]);
            return 1;
        }
    }
    if (num_eps == 0) {
        fprintf(stderr, "ep_scale: -n must be at least 1\n");
        return 1;
    }

    CHECK(uct_query_components(&components, &num_components));
    for (i = 0; i < num_components; ++i) {
        comp_attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        CHECK(uct_component_query(components[i], &comp_attr));
        if (!strcmp(comp_attr.name, "usnic")) {
            component = components[i];
        }
    }
    if (component == NULL) {
        fprintf(stderr, "ep_scale: no usnic component in this UCX\n");
        return 1;
    }

    CHECK(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async));
    CHECK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker));
    md = md_open(component, dev);

    sender   = iface_open(md, worker, dev);
    receiver = iface_open(md, worker, dev);
    CHECK(uct_iface_set_am_handler(receiver, 0, am_cb, NULL, 0));
    CHECK(uct_iface_query(receiver, &attr));
    dev_addr   = address(receiver, attr.device_addr_len, get_dev_addr);
    iface_addr = address(receiver, attr.iface_addr_len, get_iface_addr);
    uct_iface_progress_enable(sender, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_progress_enable(receiver,
                              UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);

    ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                           UCT_EP_PARAM_FIELD_IFACE_ADDR;
    ep_params.iface      = sender;
    ep_params.dev_addr   = dev_addr;
    ep_params.iface_addr = iface_addr;
    eps                  = calloc(num_eps, sizeof(*eps));

    before = heap_in_use();
    for (i = 0; i < num_eps; ++i) {
        CHECK(uct_ep_create(&ep_params, &eps[i]));
    }
    after_create = heap_in_use();

    /* One message per ep opens a stream at the receiver; one ep at a time,
     * so that the send buffer pool does not grow beyond a few buffers */
    for (i = 0; i < num_eps; ++i) {
        while (uct_ep_am_short(eps[i], 0, i, NULL, 0) == UCS_ERR_NO_RESOURCE) {
            uct_worker_progress(worker);
        }
        while (uct_ep_flush(eps[i], 0, NULL) != UCS_OK) {
            uct_worker_progress(worker);
        }
    }
    after_traffic = heap_in_use();

    printf("endpoints: %u, messages received: %zu\n", num_eps, received);
    printf("sender ep, before traffic: %.0f bytes\n",
           (double)(after_create - before) / num_eps);
    printf("sender ep + receiver stream, after traffic: %.0f bytes\n",
           (double)(after_traffic - before) / num_eps);

    if (messages > 0) {
        one = send_round_robin(worker, eps, 1, messages);
        all = send_round_robin(worker, eps, num_eps, messages);
        printf("%zu short messages on 1 ep: %.0f ns per message\n", messages,
               one * 1e9);
        printf("%zu short messages on %u eps: %.0f ns per message, %.2fx "
               "one ep\n", messages, num_eps, all * 1e9, all / one);
    }

    for (i = 0; i < num_eps; ++i) {
        uct_ep_destroy(eps[i]);
    }
    free(eps);
    free(dev_addr);
    free(iface_addr);
    uct_iface_close(sender);
    uct_iface_close(receiver);
    uct_md_close(md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    uct_release_component_list(components);
    return (received == num_eps + 2 * messages) ? 0 : 1;
}
