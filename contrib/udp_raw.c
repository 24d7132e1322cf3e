/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 *
 * Raw kernel UDP baselines for contrib/bench.sh, beside which the usnic
 * transport's kernel provider is measured. No reliability, no ordering:
 *   lat   8-byte ping-pong, busy-polling non-blocking sockets; prints the
 *         one-way latency in usec
 *   rate  8-byte datagrams, sendmmsg/recvmmsg 32 at a time; the server
 *         prints the rate it received them at (datagrams/s)
 *   bw    64 KiB sendmsg calls cut into 1472-byte datagrams by the kernel
 *         (UDP_SEGMENT), received with UDP_GRO; the server prints MB/s
 *
 *   server: udp_raw -m MODE -b <addr> -P <port>
 *   client: udp_raw -m MODE [-n count] -P <port> <addr>
 */

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#define BATCH        32
#define SEGMENT      1472
#define GSO_SEGMENTS 44            /* 64,768 bytes: one UDP length */
#define IDLE_TIMEOUT 0.5           /* seconds without a datagram that end a run */


static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static int open_socket(const char *addr, int port, int bind_it,
                       struct sockaddr_in *sa)
{
    int fd, size = 16 << 20;

    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port   = htons(port);
    if (inet_pton(AF_INET, addr, &sa->sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", addr);
        exit(2);
    }

    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        die("socket");
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size));
    if (bind_it && (bind(fd, (struct sockaddr*)sa, sizeof(*sa)) != 0)) {
        die("bind");
    }
    return fd;
}

/* Busy-poll for one datagram; 0 once the peer is silent for the timeout */
static ssize_t recv_one(int fd, void *buf, size_t len, struct sockaddr_in *from)
{
    socklen_t fromlen = sizeof(*from);
    double start      = now();
    ssize_t n;

    for (;;) {
        n = recvfrom(fd, buf, len, 0, (struct sockaddr*)from, &fromlen);
        if (n >= 0) {
            return n;
        } else if ((errno != EAGAIN) && (errno != EINTR)) {
            die("recvfrom");
        } else if ((now() - start) > IDLE_TIMEOUT * 4) {
            return 0;
        }
    }
}

static void lat_server(int fd)
{
    struct sockaddr_in from;
    char buf[64];
    ssize_t n;

    while ((n = recv_one(fd, buf, sizeof(buf), &from)) > 0) {
        sendto(fd, buf, n, 0, (struct sockaddr*)&from, sizeof(from));
    }
}

static void lat_client(int fd, const struct sockaddr_in *peer, long count)
{
    struct sockaddr_in from;
    char buf[8] = {0};
    double start = now();
    long i;

    for (i = -count / 10; i < count; ++i) { /* a tenth as warm-up */
        if (i == 0) {
            start = now();
        }
        sendto(fd, buf, sizeof(buf), 0, (const struct sockaddr*)peer,
               sizeof(*peer));
        if (recv_one(fd, buf, sizeof(buf), &from) <= 0) {
            fprintf(stderr, "no reply to ping %ld\n", i);
            exit(1);
        }
    }
    printf("latency %.3f usec one way (%ld round trips)\n",
           (now() - start) * 1e6 / count / 2, count);
}

/* Count what arrives until the sender has been silent for the timeout */
static void count_received(int fd, int gro, double bytes_unit)
{
    static char bufs[BATCH][65536];
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    double first = 0, last = 0, bytes = 0;
    unsigned long datagrams = 0;
    int i, n, one = 1;

    if (gro) {
        setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof(one));
    }

    memset(msgs, 0, sizeof(msgs));
    for (i = 0; i < BATCH; ++i) {
        iovs[i].iov_base            = bufs[i];
        iovs[i].iov_len             = sizeof(bufs[i]);
        msgs[i].msg_hdr.msg_iov     = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen  = 1;
    }

    for (;;) {
        n = recvmmsg(fd, msgs, BATCH, 0, NULL);
        if (n > 0) {
            last = now();
            if (first == 0) {
                first = last;
            }
            for (i = 0; i < n; ++i) {
                bytes     += msgs[i].msg_len;
                datagrams += gro ? ((msgs[i].msg_len + SEGMENT - 1) / SEGMENT) :
                                   1;
            }
        } else if ((n < 0) && (errno != EAGAIN) && (errno != EINTR)) {
            die("recvmmsg");
        } else if ((first != 0) && ((now() - last) > IDLE_TIMEOUT)) {
            break;
        }
    }

    if (bytes_unit == 0) {
        printf("received %lu datagrams in %.3f s: %.0f datagrams/s\n",
               datagrams, last - first, datagrams / (last - first));
    } else {
        printf("received %.0f bytes in %.3f s: %.2f MB/s\n", bytes,
               last - first, bytes / bytes_unit / (last - first));
    }
}

static void rate_client(int fd, const struct sockaddr_in *peer, long count)
{
    struct mmsghdr msgs[BATCH];
    struct iovec iov;
    char buf[8] = {0};
    long sent = 0;
    int i, n;

    iov.iov_base = buf;
    iov.iov_len  = sizeof(buf);
    memset(msgs, 0, sizeof(msgs));
    for (i = 0; i < BATCH; ++i) {
        msgs[i].msg_hdr.msg_name    = (void*)peer;
        msgs[i].msg_hdr.msg_namelen = sizeof(*peer);
        msgs[i].msg_hdr.msg_iov     = &iov;
        msgs[i].msg_hdr.msg_iovlen  = 1;
    }

    while (sent < count) {
        n = sendmmsg(fd, msgs, BATCH, 0);
        if (n > 0) {
            sent += n;
        } else if ((n < 0) && (errno != EAGAIN) && (errno != ENOBUFS)) {
            die("sendmmsg");
        }
    }
}

static void bw_client(int fd, const struct sockaddr_in *peer, long count)
{
    static char buf[SEGMENT * GSO_SEGMENTS];
    char control[CMSG_SPACE(sizeof(uint16_t))] = {0};
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr msg = {0};
    struct cmsghdr *cmsg;
    long sent = 0;

    msg.msg_name       = (void*)peer;
    msg.msg_namelen    = sizeof(*peer);
    msg.msg_iov        = &iov;
    msg.msg_iovlen     = 1;
    msg.msg_control    = control;
    msg.msg_controllen = sizeof(control);
    cmsg               = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level   = SOL_UDP;
    cmsg->cmsg_type    = UDP_SEGMENT;
    cmsg->cmsg_len     = CMSG_LEN(sizeof(uint16_t));
    *(uint16_t*)CMSG_DATA(cmsg) = SEGMENT;

    while (sent < count) {
        if (sendmsg(fd, &msg, 0) > 0) {
            sent += GSO_SEGMENTS;
        } else if ((errno != EAGAIN) && (errno != ENOBUFS)) {
            die("sendmsg(UDP_SEGMENT)");
        }
    }
}

int main(int argc, char **argv)
{
    const char *mode = "lat", *bind_addr = NULL;
    long count       = 100000;
    int port         = 0;
    struct sockaddr_in sa;
    int fd, c;

    while ((c = getopt(argc, argv, "m:b:n:P:")) != -1) {
        switch (c) {
        case 'm': mode      = optarg; break;
        case 'b': bind_addr = optarg; break;
        case 'n': count     = atol(optarg); break;
        case 'P': port      = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s -m lat|rate|bw (-b <addr> | "
                    "[-n count] <addr>) -P <port>\n", argv[0]);
            return 2;
        }
    }

    if (bind_addr != NULL) {
        fd = open_socket(bind_addr, port, 1, &sa);
        if (!strcmp(mode, "lat")) {
            lat_server(fd);
        } else {
            count_received(fd, !strcmp(mode, "bw"),
                           strcmp(mode, "bw") ? 0 : 1048576.0);
        }
    } else if (optind < argc) {
        fd = open_socket(argv[optind], port, 0, &sa);
        if (!strcmp(mode, "lat")) {
            lat_client(fd, &sa, count);
        } else if (!strcmp(mode, "rate")) {
            rate_client(fd, &sa, count);
        } else {
            bw_client(fd, &sa, count);
        }
    } else {
        fprintf(stderr, "%s: a server needs -b, a client an address\n",
                argv[0]);
        return 2;
    }

    close(fd);
    return 0;
}
