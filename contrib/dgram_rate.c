/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 *
 * Raw libfabric datagram message rate: the baseline contrib/bench.sh sets
 * beside "ucx_perftest -t am_bw -x usnic". No reliability, no flow control:
 * the client sends as fast as the provider takes datagrams, the server
 * counts what arrives and reports the rate it received them at.
 *
 *   server: dgram_rate [-p prov] [-s size] -b <addr> -P <port>
 *   client: dgram_rate [-p prov] [-s size] [-n count] -P <port> <addr>
 */

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RX_DEPTH     256
#define BUF_SIZE     2048
#define IDLE_TIMEOUT 0.5 /* seconds without a datagram that end a run */

struct rx_slot {
    struct fi_context2 ctx;
    char               buf[BUF_SIZE];
};

struct dgram {
    struct fi_info    *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq     *cq;
    struct fid_av     *av;
    struct fid_ep     *ep;
    struct fid_mr     *mr;
    struct rx_slot    *slots;
    size_t            prefix;
};

static void die(const char *what, int ret)
{
    fprintf(stderr, "dgram_rate: %s: %s\n", what, fi_strerror(-ret));
    exit(1);
}

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void dgram_open(struct dgram *d, const char *prov, const char *node,
                       const char *service, uint64_t flags)
{
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT,
                                 .size   = RX_DEPTH * 4};
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    struct fi_info *hints     = fi_allocinfo();
    int ret;

    hints->ep_attr->type          = FI_EP_DGRAM;
    hints->caps                   = FI_MSG;
    hints->mode                   = FI_CONTEXT | FI_CONTEXT2 | FI_MSG_PREFIX;
    hints->addr_format            = FI_SOCKADDR_IN;
    hints->domain_attr->mr_mode   = FI_MR_LOCAL | FI_MR_VIRT_ADDR |
                                    FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov);

    ret = fi_getinfo(FI_VERSION(1, 5), node, service, flags, hints, &d->info);
    fi_freeinfo(hints);
    if (ret) {
        die("fi_getinfo", ret);
    }

    if ((ret = fi_fabric(d->info->fabric_attr, &d->fabric, NULL)) ||
        (ret = fi_domain(d->fabric, d->info, &d->domain, NULL)) ||
        (ret = fi_cq_open(d->domain, &cq_attr, &d->cq, NULL)) ||
        (ret = fi_av_open(d->domain, &av_attr, &d->av, NULL)) ||
        (ret = fi_endpoint(d->domain, d->info, &d->ep, NULL)) ||
        (ret = fi_ep_bind(d->ep, &d->cq->fid, FI_TRANSMIT | FI_RECV)) ||
        (ret = fi_ep_bind(d->ep, &d->av->fid, 0)) ||
        (ret = fi_enable(d->ep))) {
        die("opening the endpoint", ret);
    }

    d->prefix = (d->info->mode & FI_MSG_PREFIX) ?
                d->info->ep_attr->msg_prefix_size : 0;
    d->slots  = calloc(RX_DEPTH, sizeof(*d->slots));
    ret       = fi_mr_reg(d->domain, d->slots, RX_DEPTH * sizeof(*d->slots),
                          FI_SEND | FI_RECV, 0, 0, 0, &d->mr, NULL);
    if (ret) {
        die("fi_mr_reg", ret);
    }
}

static void post_recv(struct dgram *d, struct rx_slot *slot)
{
    int ret;

    do {
        ret = fi_recv(d->ep, slot->buf, BUF_SIZE, fi_mr_desc(d->mr), 0,
                      &slot->ctx);
    } while (ret == -FI_EAGAIN);
    if (ret) {
        die("fi_recv", ret);
    }
}

static void server(struct dgram *d)
{
    struct fi_cq_entry entries[64];
    double first = 0, last = 0;
    unsigned long count = 0;
    ssize_t i, n;

    for (i = 0; i < RX_DEPTH; ++i) {
        post_recv(d, &d->slots[i]);
    }

    printf("ready\n");
    fflush(stdout);
    for (;;) {
        n = fi_cq_read(d->cq, entries, 64);
        if (n == -FI_EAGAIN) {
            if ((count > 0) && (now() - last > IDLE_TIMEOUT)) {
                break;
            }
            continue;
        } else if (n < 0) {
            die("fi_cq_read", (int)n);
        }

        last = now();
        if (count == 0) {
            first = last;
        }
        count += n;
        for (i = 0; i < n; ++i) {
            post_recv(d, (struct rx_slot*)entries[i].op_context);
        }
    }

    printf("received %lu datagrams in %.3f s: %.0f msg/s\n", count,
           last - first, (count > 1) ? (count - 1) / (last - first) : 0.0);
}

static void client(struct dgram *d, const char *addr, size_t size,
                   unsigned long count)
{
    char *buf = calloc(1, d->prefix + size);
    struct fi_cq_entry entries[64];
    unsigned long i;
    fi_addr_t dest;
    double start;
    int ret;

    if (fi_av_insert(d->av, d->info->dest_addr, 1, &dest, 0, NULL) != 1) {
        fprintf(stderr, "dgram_rate: cannot resolve %s\n", addr);
        exit(1);
    }

    start = now();
    for (i = 0; i < count; ++i) {
        do {
            ret = fi_inject(d->ep, buf, d->prefix + size, dest);
            if (ret == -FI_EAGAIN) {
                fi_cq_read(d->cq, entries, 64);
            }
        } while (ret == -FI_EAGAIN);
        if (ret) {
            die("fi_inject", ret);
        }
    }

    printf("sent %lu datagrams of %zu bytes in %.3f s: %.0f msg/s\n", count,
           size, now() - start, count / (now() - start));
    free(buf);
}

int main(int argc, char **argv)
{
    const char *prov = "udp", *bind_addr = NULL, *port = "47600";
    unsigned long count = 1000000;
    struct dgram d      = {0};
    size_t size         = 8;
    int c;

    while ((c = getopt(argc, argv, "p:s:n:b:P:")) != -1) {
        switch (c) {
        case 'p': prov = optarg; break;
        case 's': size = strtoul(optarg, NULL, 0); break;
        case 'n': count = strtoul(optarg, NULL, 0); break;
        case 'b': bind_addr = optarg; break;
        case 'P': port = optarg; break;
        default:
            fprintf(stderr, "usage: %s [-p prov] [-s size] [-n count] "
                            "[-P port] (-b <bind addr> | <server addr>)\n",
                    argv[0]);
            return 1;
        }
    }

    if (size > BUF_SIZE) {
        fprintf(stderr, "dgram_rate: size %zu larger than %d\n", size,
                BUF_SIZE);
        return 1;
    }

    if (bind_addr != NULL) {
        dgram_open(&d, prov, bind_addr, port, FI_SOURCE);
        server(&d);
    } else if (optind < argc) {
        dgram_open(&d, prov, argv[optind], port, 0);
        client(&d, argv[optind], size, count);
    } else {
        fprintf(stderr, "dgram_rate: need -b <addr> or a server address\n");
        return 1;
    }
    return 0;
}
