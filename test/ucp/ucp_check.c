/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 *
 * ucp_check: checks every byte that UCP carries between two processes.
 *
 *   server:  ucp_check [options]
 *   client:  ucp_check [options] <server IPv4 address>
 *
 * The two sides exchange their UCP worker addresses over a TCP connection
 * (which then serves only as a barrier between the phases), connect with
 * peer error handling, and run these phases in turn:
 *
 *   tag  both sides send tag messages to each other at the same time, on one
 *        tag per direction; a message carries its sequence number in its
 *        first 8 bytes, so a lost, duplicated or reordered one is caught
 *   am   the same with UCP active messages; the sequence number travels in
 *        the AM header and is checked in the handler, eager data is checked
 *        in the handler, rendezvous data once ucp_am_recv_data_nbx completes
 *   put  the client puts into a region the server mapped, flushes, and tells
 *        the server (a tag message) what it wrote; the server compares its
 *        whole region with a shadow copy and replies
 *   get  the server fills its region with a known pattern, the client reads
 *        random ranges of it and checks them
 *
 * Sizes are log-uniform from 1 byte to -m (every power of two is as likely
 * as any other), offsets random; every byte is a function of (seed, kind,
 * direction, iteration, byte index), and a receive buffer is filled with
 * the complement of what is expected before it is posted, so a misplaced,
 * duplicated, stale or missing byte shows. The client's -n, -s, -m and -k
 * are sent to the server and used by both sides.
 *
 * Options:
 *   -p PORT    TCP port of the server (default 13337)
 *   -l ADDR    IPv4 address the server listens on (default 0.0.0.0)
 *   -n N       iterations per kind (default 100)
 *   -s SEED    seed (default: from the clock; printed)
 *   -m SIZE    largest message or transfer, k/m suffixes (default 4m)
 *   -k KINDS   comma-separated subset of tag,am,put,get (default all)
 *   -w N       operations in flight per direction (default 4)
 *   -t SEC     overall timeout (default 120)
 *   -u         AMs may arrive in any order, each still exactly once: with
 *              several eager rails (UCX_MAX_EAGER_RAILS > 1) UCP sends the
 *              fragments of one message over all of them and calls the
 *              handler when the last one is in, so a later one-fragment
 *              message can come first (UCP orders such messages only for
 *              handlers that take fragments, not UCP_AM_FLAG_WHOLE_MSG)
 *
 * Prints one summary line per kind and a final PASS or FAIL line; exits 0
 * only when every check passed.
 */

#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>


#define CHECK_DEFAULT_PORT     13337
#define CHECK_DEFAULT_ITERS    100
#define CHECK_DEFAULT_MAX_SIZE (4ul << 20)
#define CHECK_DEFAULT_TIMEOUT  120
#define CHECK_DEFAULT_WINDOW   4
#define CHECK_MAX_WINDOW       64
#define CHECK_MIN_REGION       (4ul << 20)
#define CHECK_MAGIC            0x31544b4843505543ull /* "UCPCHKT1" */
#define CHECK_AM_ID            11
#define CHECK_TAG_DATA         0x7563000000000000ull /* | direction */
#define CHECK_TAG_PUT_REPORT   0x7563000000000100ull
#define CHECK_TAG_PUT_REPLY    0x7563000000000101ull
#define CHECK_PEEK_INTERVAL    0.05  /* seconds between control socket peeks */
#define CHECK_ALARM_GRACE      10    /* seconds after -t for the hard alarm */
#define CHECK_MB               (1024.0 * 1024.0)

/* Control bytes on the TCP connection */
#define CHECK_CTRL_BARRIER     'B'
#define CHECK_CTRL_FAILED      'X'


typedef enum {
    CHECK_KIND_TAG,
    CHECK_KIND_AM,
    CHECK_KIND_PUT,
    CHECK_KIND_GET,
    CHECK_KIND_LAST,
    /* key domain of the region's content before the first put */
    CHECK_KEY_PUT_INIT = CHECK_KIND_LAST
} check_kind_t;


static const char *check_kind_names[] = {
    [CHECK_KIND_TAG] = "tag",
    [CHECK_KIND_AM]  = "am",
    [CHECK_KIND_PUT] = "put",
    [CHECK_KIND_GET] = "get"
};


/* Directions of a stream of messages */
enum {
    CHECK_DIR_C2S = 0,
    CHECK_DIR_S2C = 1
};


typedef struct {
    const char *peer;        /* server address; NULL on the server */
    const char *listen_addr;
    uint16_t   port;
    uint64_t   iters;
    uint64_t   seed;
    size_t     max_size;
    unsigned   timeout;
    unsigned   window;
    unsigned   kinds;        /* bit mask of check_kind_t */
    int        am_any_order; /* -u */
} check_opts_t;


/* Client to server, followed by the client's worker address */
typedef struct {
    uint64_t magic;
    uint64_t iters;
    uint64_t seed;
    uint64_t max_size;
    uint64_t kinds;
    uint64_t addr_length;
} check_hello_t;


/* Server to client, followed by the worker address and the packed rkey */
typedef struct {
    uint64_t magic;
    uint64_t region_addr;
    uint64_t region_size;
    uint64_t addr_length;
    uint64_t rkey_length;
} check_welcome_t;


/* AM header: the sequence number and the length of the payload */
typedef struct {
    uint64_t seq;
    uint64_t length;
} check_am_hdr_t;


/* What the client put (client to server) and what the server found */
typedef struct {
    uint64_t iter;
    uint64_t seed;
    uint64_t offset;
    uint64_t length;
} check_put_report_t;


typedef struct {
    uint64_t iter;
    uint64_t bad;            /* bytes of the region that differ */
    uint64_t first;          /* region offset of the first of them */
    uint64_t last;           /* and of the last */
    uint8_t  expected;
    uint8_t  got;
    uint8_t  invalid;        /* the report itself made no sense */
    uint8_t  pad[5];
} check_put_reply_t;


/* Differences between a buffer and the pattern it should hold */
typedef struct {
    uint64_t count;
    uint64_t first;
    uint64_t last;
    uint8_t  expected;
    uint8_t  got;
} check_diff_t;


typedef struct check_ctx check_ctx_t;


/* One operation in flight; user_data of its UCP request */
typedef struct {
    int                 done;
    ucs_status_t        status;
    uint64_t            iter;
    size_t              size;
    uint64_t            offset;
    size_t              length;  /* received length */
    uint8_t             *buf;
    ucp_tag_recv_info_t info;
    check_am_hdr_t      am_hdr;  /* must live until an AM send completes */
} check_op_t;


/* A rendezvous AM being received */
typedef struct {
    check_ctx_t *ctx;
    uint64_t    seq;
    size_t      size;
    size_t      length;
    uint8_t     *buf;
} check_am_rndv_t;


/* Receiving side of the AM phase, driven by the handler */
typedef struct {
    uint64_t next_seq;       /* sequence number the next AM must carry */
    uint8_t  *seen;          /* with -u: a bit per message that arrived */
    uint64_t checked;        /* AMs received and checked */
    uint64_t bytes;
    uint64_t eager;
    uint64_t rndv;
    uint64_t rndv_inflight;
} check_am_rx_t;


typedef struct {
    int      ran;
    uint64_t tx_count;
    uint64_t tx_bytes;
    uint64_t rx_count;
    uint64_t rx_bytes;
    uint64_t eager;
    uint64_t rndv;
    double   seconds;
} check_result_t;


struct check_ctx {
    check_opts_t   opts;
    int            is_server;
    const char     *role;
    unsigned       tx_dir;
    unsigned       rx_dir;
    int            sock;
    double         start;
    double         deadline;
    double         next_peek;
    int            failed;
    int            closing;
    char           what[256];   /* what a plain wait is waiting for */

    ucp_context_h  context;
    ucp_worker_h   worker;
    ucp_ep_h       ep;

    /* server: the mapped region and what it should hold */
    uint8_t        *region;
    uint8_t        *shadow;
    size_t         region_size;
    ucp_mem_h      memh;
    void           *rkey_buf;
    size_t         rkey_length;

    /* client: the server's region */
    uint64_t       remote_addr;
    size_t         remote_size;
    ucp_rkey_h     rkey;

    check_op_t     tx_ops[CHECK_MAX_WINDOW];
    check_op_t     rx_ops[CHECK_MAX_WINDOW];
    check_am_rx_t  am_rx;
};


/*
 * The only global: the text the SIGALRM backstop prints when a UCX call
 * itself never returns, so that the deadline checks in the wait loops
 * cannot run.
 */
static char check_alarm_text[320];


static double check_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + (ts.tv_nsec * 1e-9);
}

static void check_log(const check_ctx_t *ctx, const char *fmt, ...)
{
    va_list ap;

    printf("ucp_check %s: ", ctx->role);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

/* Reports a failure; the first one also tells the peer */
static ucs_status_t check_fail(check_ctx_t *ctx, ucs_status_t status,
                               const char *fmt, ...)
{
    char ctrl = CHECK_CTRL_FAILED;
    va_list ap;

    /* what follows the first failure is often only a consequence of it */
    printf("ucp_check %s: %s", ctx->role, ctx->failed ? "also: " : "FAIL: ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");

    if (!ctx->failed && (ctx->sock >= 0)) {
        (void)send(ctx->sock, &ctrl, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    ctx->failed = 1;
    return status;
}

static ucs_status_t check_timeout(check_ctx_t *ctx, const char *fmt, ...)
{
    char text[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    return check_fail(ctx, UCS_ERR_TIMED_OUT,
                      "TIMEOUT after %u s (%.1f s since start) in %s",
                      ctx->opts.timeout, check_now() - ctx->start, text);
}

/*
 * After check_progress() failed: a timeout is reported with what was in
 * progress, any other failure (the peer's, an endpoint error) gets it as
 * context.
 */
static ucs_status_t check_stopped(check_ctx_t *ctx, ucs_status_t status,
                                  const char *state)
{
    if (status == UCS_ERR_TIMED_OUT) {
        return check_timeout(ctx, "%s", state);
    }
    check_log(ctx, "in progress then: %s", state);
    return status;
}

static void check_alarm_handler(int signo)
{
    ssize_t ret;

    (void)signo;
    ret = write(STDOUT_FILENO, check_alarm_text, strlen(check_alarm_text));
    (void)ret;
    _exit(3);
}

static void check_set_phase(const check_ctx_t *ctx, const char *phase)
{
    snprintf(check_alarm_text, sizeof(check_alarm_text),
             "ucp_check %s: FAIL: TIMEOUT (hard: a UCX call did not return "
             "within %u s) in %s\n", ctx->role,
             ctx->opts.timeout + CHECK_ALARM_GRACE, phase);
}


/*
 * Data patterns. splitmix64's finalizer turns (seed, kind, direction,
 * iteration) into a key and (key, word index) into 8 bytes of data.
 */

static inline uint64_t check_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t check_key(uint64_t seed, unsigned kind, unsigned dir,
                          uint64_t iter)
{
    uint64_t key;

    key = check_mix(seed + 0x9e3779b97f4a7c15ull);
    key = check_mix(key ^ (((uint64_t)kind << 8) | dir));
    return check_mix(key + iter);
}

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the pattern code stores words as little-endian bytes"
#endif

static inline uint64_t check_word(uint64_t key, uint64_t word)
{
    return check_mix(key + ((word + 1) * 0x9e3779b97f4a7c15ull));
}

/* Byte i of the buffer is the pattern's byte (start + i), xor'ed with flip */
static void check_pattern_fill(uint64_t key, uint64_t start, uint8_t *buf,
                               size_t length, uint8_t flip)
{
    const uint64_t flip64 = flip * 0x0101010101010101ull;
    uint64_t index        = start;
    size_t i              = 0;
    uint64_t word;

    /* up to the first word boundary, then whole words, then the tail */
    while ((i < length) && ((index % 8 != 0) || (length - i < 8))) {
        buf[i++] = (uint8_t)(check_word(key, index / 8) >> (8 * (index % 8))) ^
                   flip;
        ++index;
    }
    for (; length - i >= 8; i += 8, index += 8) {
        word = check_word(key, index / 8) ^ flip64;
        memcpy(buf + i, &word, sizeof(word));
    }
    for (; i < length; ++i, ++index) {
        buf[i] = (uint8_t)(check_word(key, index / 8) >> (8 * (index % 8))) ^
                 flip;
    }
}

static void check_diff_add(check_diff_t *diff, uint64_t index,
                           uint8_t expected, uint8_t got)
{
    if (diff->count == 0) {
        diff->first    = index;
        diff->expected = expected;
        diff->got      = got;
    }
    diff->last = index;
    ++diff->count;
}

/* Returns the number of bytes that differ from the pattern */
static uint64_t check_pattern_cmp(uint64_t key, uint64_t start,
                                  const uint8_t *buf, size_t length,
                                  check_diff_t *diff)
{
    uint64_t index = start;
    size_t i       = 0;
    uint64_t word, got;
    uint8_t expected;
    unsigned b;

    memset(diff, 0, sizeof(*diff));
    while (i < length) {
        word = check_word(key, index / 8);
        if ((index % 8 == 0) && (length - i >= 8)) {
            memcpy(&got, buf + i, sizeof(got));
            if (got == word) {
                i     += 8;
                index += 8;
                continue;
            }
        }
        /* a partial word, or a whole one that differs: byte by byte */
        b = index % 8;
        do {
            expected = (uint8_t)(word >> (8 * b));
            if (buf[i] != expected) {
                check_diff_add(diff, index, expected, buf[i]);
            }
            ++i;
            ++index;
        } while ((++b < 8) && (i < length));
    }
    return diff->count;
}

/* Log-uniform size in [1, max]: a power of two, then a size in its octave */
static size_t check_size(uint64_t key, size_t max)
{
    uint64_t h      = check_mix(key ^ 0x5157a1e5ull);
    unsigned octave = (unsigned)(h % (64 - __builtin_clzll(max)));
    uint64_t low    = 1ull << octave;
    uint64_t size   = low + (check_mix(h) % low);

    return (size > max) ? max : size;
}

static uint64_t check_offset(uint64_t key, size_t region, size_t size)
{
    return check_mix(key ^ 0x0ff5e7ull) % (region - size + 1);
}

static size_t check_msg_size(const check_ctx_t *ctx, check_kind_t kind,
                             unsigned dir, uint64_t seq)
{
    return check_size(check_key(ctx->opts.seed, kind, dir, seq),
                      ctx->opts.max_size);
}

/* A tag message carries its sequence number in its first 8 bytes */
static void check_msg_fill(const check_ctx_t *ctx, check_kind_t kind,
                           unsigned dir, uint64_t seq, uint8_t *buf,
                           size_t size, uint8_t flip)
{
    check_pattern_fill(check_key(ctx->opts.seed, kind, dir, seq), 0, buf,
                       size, flip);
    if ((kind == CHECK_KIND_TAG) && (size >= sizeof(seq)) && !flip) {
        memcpy(buf, &seq, sizeof(seq));
    }
}

static ucs_status_t check_msg(check_ctx_t *ctx, check_kind_t kind,
                              unsigned dir, uint64_t seq, const uint8_t *buf,
                              size_t length)
{
    size_t expected = check_msg_size(ctx, kind, dir, seq);
    size_t skip     = 0;
    char problems[512];
    check_diff_t diff;
    uint64_t got_seq;
    size_t cmp_len;
    int pos         = 0;

    problems[0] = '\0';
    if (length != expected) {
        pos += snprintf(problems + pos, sizeof(problems) - pos,
                        "; length %zu, expected %zu", length, expected);
    }

    cmp_len = (length < expected) ? length : expected;
    if ((kind == CHECK_KIND_TAG) && (expected >= sizeof(seq))) {
        if (cmp_len >= sizeof(seq)) {
            memcpy(&got_seq, buf, sizeof(got_seq));
            if (got_seq != seq) {
                pos += snprintf(problems + pos, sizeof(problems) - pos,
                                "; carries sequence number %" PRIu64
                                " (out of order, lost or duplicated)",
                                got_seq);
            }
        }
        skip    = sizeof(seq);
        cmp_len = (cmp_len < skip) ? skip : cmp_len;
    }

    if (check_pattern_cmp(check_key(ctx->opts.seed, kind, dir, seq), skip,
                          buf + skip, cmp_len - skip, &diff) != 0) {
        pos += snprintf(problems + pos, sizeof(problems) - pos,
                        "; first mismatch at offset %" PRIu64 ": expected "
                        "0x%02x, got 0x%02x (%" PRIu64 " bytes differ, the "
                        "last at offset %" PRIu64 ")", diff.first,
                        diff.expected, diff.got, diff.count, diff.last);
    }

    if (pos == 0) {
        return UCS_OK;
    }

    return check_fail(ctx, UCS_ERR_IO_ERROR,
                      "%s %s message %" PRIu64 " (size %zu, seed %" PRIu64
                      ")%s", check_kind_names[kind],
                      (dir == CHECK_DIR_C2S) ? "client->server" :
                                               "server->client",
                      seq, expected, ctx->opts.seed, problems);
}


/*
 * The TCP control connection.
 */

static ucs_status_t check_sock_send(check_ctx_t *ctx, const void *buf,
                                    size_t length)
{
    const char *p = buf;
    ssize_t ret;

    while (length > 0) {
        ret = send(ctx->sock, p, length, MSG_NOSIGNAL);
        if (ret < 0) {
            if (errno == EINTR) {
                continue;
            }
            return check_fail(ctx, UCS_ERR_IO_ERROR,
                              "send on the control connection: %s",
                              strerror(errno));
        }
        p      += ret;
        length -= ret;
    }
    return UCS_OK;
}

static ucs_status_t check_sock_recv(check_ctx_t *ctx, void *buf,
                                    size_t length, const char *what)
{
    struct pollfd pfd = { .fd = ctx->sock, .events = POLLIN };
    char *p           = buf;
    double left;
    ssize_t ret;

    while (length > 0) {
        left = ctx->deadline - check_now();
        if (left <= 0) {
            return check_timeout(ctx, "%s", what);
        }
        ret = poll(&pfd, 1, (int)(left * 1000) + 1);
        if ((ret < 0) && (errno != EINTR)) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "poll: %s",
                              strerror(errno));
        } else if (ret <= 0) {
            continue;
        }
        ret = recv(ctx->sock, p, length, 0);
        if (ret == 0) {
            return check_fail(ctx, UCS_ERR_CONNECTION_RESET,
                              "%s: the peer closed the control connection",
                              what);
        } else if (ret < 0) {
            if (errno == EINTR) {
                continue;
            }
            return check_fail(ctx, UCS_ERR_IO_ERROR, "%s: recv: %s", what,
                              strerror(errno));
        }
        p      += ret;
        length -= ret;
    }
    return UCS_OK;
}

static ucs_status_t check_sock_open(check_ctx_t *ctx)
{
    struct timespec retry  = { .tv_sec = 0, .tv_nsec = 100000000 };
    struct sockaddr_in sin = { .sin_family = AF_INET };
    const char *addr       = ctx->is_server ? ctx->opts.listen_addr :
                                              ctx->opts.peer;
    struct pollfd pfd;
    int fd, ret, one = 1;
    double left;

    sin.sin_port = htons(ctx->opts.port);
    if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) {
        return check_fail(ctx, UCS_ERR_INVALID_PARAM,
                          "'%s' is not an IPv4 address", addr);
    }

    if (!ctx->is_server) {
        for (;;) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (fd < 0) {
                return check_fail(ctx, UCS_ERR_IO_ERROR, "socket: %s",
                                  strerror(errno));
            }
            if (connect(fd, (struct sockaddr*)&sin, sizeof(sin)) == 0) {
                break;
            }
            ret = errno;
            close(fd);
            if (((ret != ECONNREFUSED) && (ret != EINTR)) ||
                (check_now() >= ctx->deadline)) {
                return check_fail(ctx, UCS_ERR_UNREACHABLE,
                                  "connect to %s:%u: %s", addr,
                                  ctx->opts.port, strerror(ret));
            }
            nanosleep(&retry, NULL);
        }
        ctx->sock = fd;
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "socket: %s",
                              strerror(errno));
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if ((bind(fd, (struct sockaddr*)&sin, sizeof(sin)) != 0) ||
            (listen(fd, 1) != 0)) {
            ret = errno;
            close(fd);
            return check_fail(ctx, UCS_ERR_IO_ERROR, "listen on %s:%u: %s",
                              addr, ctx->opts.port, strerror(ret));
        }
        check_log(ctx, "listening on %s:%u", addr, ctx->opts.port);
        fflush(stdout);

        pfd.fd     = fd;
        pfd.events = POLLIN;
        do {
            left = ctx->deadline - check_now();
            if (left <= 0) {
                close(fd);
                return check_timeout(ctx, "waiting for the client to "
                                     "connect");
            }
            ret = poll(&pfd, 1, (int)(left * 1000) + 1);
        } while ((ret == 0) || ((ret < 0) && (errno == EINTR)));

        ctx->sock = (ret > 0) ? accept(fd, NULL, NULL) : -1;
        ret       = errno;
        close(fd);
        if (ctx->sock < 0) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "accept: %s",
                              strerror(ret));
        }
    }

    setsockopt(ctx->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return UCS_OK;
}


/*
 * Progress and waiting.
 */

/* Whether the peer has reported a failure or closed the control socket */
static int check_peer_failed(const check_ctx_t *ctx)
{
    ssize_t ret;
    char c;

    /* a barrier byte may wait there: only look */
    ret = recv(ctx->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return (ret == 0) || ((ret == 1) && (c == CHECK_CTRL_FAILED));
}

/* One round of progress: fails on a failure, a dead peer or the deadline */
static ucs_status_t check_progress(check_ctx_t *ctx)
{
    double now;

    ucp_worker_progress(ctx->worker);
    if (ctx->failed) {
        return UCS_ERR_IO_ERROR;
    }

    now = check_now();
    if (now < ctx->next_peek) {
        return UCS_OK;
    }
    ctx->next_peek = now + CHECK_PEEK_INTERVAL;

    if (now >= ctx->deadline) {
        return UCS_ERR_TIMED_OUT;
    }

    if (!ctx->closing && check_peer_failed(ctx)) {
        return check_fail(ctx, UCS_ERR_CANCELED, "the peer reported a "
                          "failure or exited");
    }
    return UCS_OK;
}

/* Waits for ops (any of them may be NULL); ctx->what says what for */
static ucs_status_t check_wait(check_ctx_t *ctx, check_op_t *op1,
                               check_op_t *op2)
{
    ucs_status_t status;

    while (((op1 != NULL) && !op1->done) || ((op2 != NULL) && !op2->done)) {
        status = check_progress(ctx);
        if (status != UCS_OK) {
            return check_stopped(ctx, status, ctx->what);
        }
    }

    if ((op1 != NULL) && (op1->status != UCS_OK)) {
        return check_fail(ctx, op1->status, "%s: %s", ctx->what,
                          ucs_status_string(op1->status));
    }
    if ((op2 != NULL) && (op2->status != UCS_OK)) {
        return check_fail(ctx, op2->status, "%s: %s", ctx->what,
                          ucs_status_string(op2->status));
    }
    return UCS_OK;
}

static ucs_status_t check_barrier(check_ctx_t *ctx, const char *what)
{
    char c = CHECK_CTRL_BARRIER;
    ucs_status_t status;
    ssize_t ret;

    status = check_sock_send(ctx, &c, 1);
    if (status != UCS_OK) {
        return status;
    }

    /* Keep progressing: the peer may still need us to finish its part */
    for (;;) {
        ret = recv(ctx->sock, &c, 1, MSG_DONTWAIT);
        if (ret == 1) {
            if (c == CHECK_CTRL_BARRIER) {
                return UCS_OK;
            }
            return check_fail(ctx, UCS_ERR_CANCELED,
                              "the peer reported a failure");
        } else if (ret == 0) {
            return check_fail(ctx, UCS_ERR_CONNECTION_RESET,
                              "%s: the peer closed the control connection",
                              what);
        } else if ((errno != EAGAIN) && (errno != EWOULDBLOCK) &&
                   (errno != EINTR)) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "%s: recv: %s", what,
                              strerror(errno));
        }

        status = check_progress(ctx);
        if (status != UCS_OK) {
            return check_stopped(ctx, status, what);
        }
    }
}


/*
 * Request completion.
 */

static void check_op_reset(check_op_t *op)
{
    op->done   = 0;
    op->status = UCS_INPROGRESS;
    op->length = 0;
}

/* Records what an nbx call returned; the callback completes the rest */
static ucs_status_t check_op_started(check_op_t *op, ucs_status_ptr_t ptr)
{
    if (ptr == NULL) {
        op->done   = 1;
        op->status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(ptr)) {
        op->done   = 1;
        op->status = UCS_PTR_STATUS(ptr);
    }
    return op->status == UCS_INPROGRESS ? UCS_OK : op->status;
}

static void check_send_cb(void *request, ucs_status_t status,
                          void *user_data)
{
    check_op_t *op = user_data;

    op->status = status;
    op->done   = 1;
    ucp_request_free(request);
}

static void check_tag_recv_cb(void *request, ucs_status_t status,
                              const ucp_tag_recv_info_t *info,
                              void *user_data)
{
    check_op_t *op = user_data;

    op->status = status;
    if (status == UCS_OK) {
        op->info   = *info;
        op->length = info->length;
    }
    op->done = 1;
    ucp_request_free(request);
}

static void check_param_send(ucp_request_param_t *param, check_op_t *op)
{
    memset(param, 0, sizeof(*param));
    param->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          UCP_OP_ATTR_FIELD_USER_DATA;
    param->cb.send      = check_send_cb;
    param->user_data    = op;
}

/*
 * UCX 1.13.1's ucp_tag_recv_nbx does not fill recv_info.tag_info when it
 * completes at once (1.22 does): the callback always reports the length.
 */
static void check_param_tag_recv(ucp_request_param_t *param, check_op_t *op)
{
    memset(param, 0, sizeof(*param));
    param->op_attr_mask       = UCP_OP_ATTR_FIELD_CALLBACK |
                                UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_RECV_INFO |
                                UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param->cb.recv            = check_tag_recv_cb;
    param->user_data          = op;
    param->recv_info.tag_info = &op->info;
}

static ucs_status_t check_tag_send(check_ctx_t *ctx, check_op_t *op,
                                   const void *buf, size_t length,
                                   ucp_tag_t tag)
{
    ucp_request_param_t param;

    check_op_reset(op);
    check_param_send(&param, op);
    return check_op_started(op, ucp_tag_send_nbx(ctx->ep, buf, length, tag,
                                                 &param));
}

static ucs_status_t check_tag_recv(check_ctx_t *ctx, check_op_t *op,
                                   void *buf, size_t length, ucp_tag_t tag)
{
    ucp_request_param_t param;

    check_op_reset(op);
    check_param_tag_recv(&param, op);
    return check_op_started(op, ucp_tag_recv_nbx(ctx->worker, buf, length,
                                                 tag, (ucp_tag_t)-1, &param));
}


/*
 * tag and am: both directions at once, a window of sends on each side.
 */

static ucs_status_t check_stream_send(check_ctx_t *ctx, check_kind_t kind,
                                      check_op_t *op, uint64_t seq)
{
    ucp_request_param_t param;
    ucs_status_ptr_t ptr;

    op->iter = seq;
    op->size = check_msg_size(ctx, kind, ctx->tx_dir, seq);
    check_msg_fill(ctx, kind, ctx->tx_dir, seq, op->buf, op->size, 0);

    if (kind == CHECK_KIND_TAG) {
        return check_tag_send(ctx, op, op->buf, op->size,
                              CHECK_TAG_DATA | ctx->tx_dir);
    }

    op->am_hdr.seq    = seq;
    op->am_hdr.length = op->size;
    check_op_reset(op);
    check_param_send(&param, op);
    ptr = ucp_am_send_nbx(ctx->ep, CHECK_AM_ID, &op->am_hdr,
                          sizeof(op->am_hdr), op->buf, op->size, &param);
    return check_op_started(op, ptr);
}

static ucs_status_t check_stream_recv(check_ctx_t *ctx, check_op_t *op,
                                      uint64_t seq)
{
    op->iter = seq;
    op->size = check_msg_size(ctx, CHECK_KIND_TAG, ctx->rx_dir, seq);
    /* the complement of what should arrive: a byte left unwritten shows */
    check_msg_fill(ctx, CHECK_KIND_TAG, ctx->rx_dir, seq, op->buf, op->size,
                   0xff);
    return check_tag_recv(ctx, op, op->buf, ctx->opts.max_size,
                          CHECK_TAG_DATA | ctx->rx_dir);
}

static void check_am_rndv_done(check_am_rndv_t *rndv, ucs_status_t status,
                               size_t length)
{
    check_ctx_t *ctx = rndv->ctx;

    --ctx->am_rx.rndv_inflight;
    if (status != UCS_OK) {
        check_fail(ctx, status, "am rendezvous receive of message %" PRIu64
                   " (size %zu, seed %" PRIu64 "): %s", rndv->seq, rndv->size,
                   ctx->opts.seed, ucs_status_string(status));
    } else if (length != rndv->size) {
        check_fail(ctx, UCS_ERR_IO_ERROR, "am rendezvous receive of message "
                   "%" PRIu64 " (seed %" PRIu64 "): %zu bytes, expected %zu",
                   rndv->seq, ctx->opts.seed, length, rndv->size);
    } else if (check_msg(ctx, CHECK_KIND_AM, ctx->rx_dir, rndv->seq,
                         rndv->buf, length) == UCS_OK) {
        ++ctx->am_rx.checked;
        ctx->am_rx.bytes += length;
    }
    free(rndv->buf);
    free(rndv);
}

static void check_am_data_cb(void *request, ucs_status_t status,
                             size_t length, void *user_data)
{
    check_am_rndv_done(user_data, status, length);
    ucp_request_free(request);
}

static ucs_status_t check_am_cb(void *arg, const void *header,
                                size_t header_length, void *data,
                                size_t length,
                                const ucp_am_recv_param_t *param)
{
    check_ctx_t *ctx = arg;
    check_am_rx_t *rx = &ctx->am_rx;
    ucp_request_param_t rparam;
    check_am_rndv_t *rndv;
    check_am_hdr_t hdr;
    ucs_status_ptr_t ptr;

    if (header_length != sizeof(hdr)) {
        check_fail(ctx, UCS_ERR_IO_ERROR, "am: header of %zu bytes, expected "
                   "%zu", header_length, sizeof(hdr));
        return UCS_OK;
    }
    memcpy(&hdr, header, sizeof(hdr));

    if (!ctx->opts.am_any_order) {
        if (hdr.seq != rx->next_seq) {
            check_fail(ctx, UCS_ERR_IO_ERROR, "am: message %" PRIu64
                       " arrived when %" PRIu64 " was due (out of order, "
                       "lost or duplicated; seed %" PRIu64 ")", hdr.seq,
                       rx->next_seq, ctx->opts.seed);
        }
        rx->next_seq = hdr.seq + 1;
    } else if (rx->seen == NULL) {
        check_fail(ctx, UCS_ERR_NO_MEMORY, "am: no memory to track %" PRIu64
                   " messages", ctx->opts.iters);
        return UCS_OK;
    } else if ((hdr.seq >= ctx->opts.iters) ||
               (rx->seen[hdr.seq / 8] & (1u << (hdr.seq % 8)))) {
        check_fail(ctx, UCS_ERR_IO_ERROR, "am: message %" PRIu64 " arrived "
                   "twice or was never sent (seed %" PRIu64 ")", hdr.seq,
                   ctx->opts.seed);
        return UCS_OK;
    } else {
        rx->seen[hdr.seq / 8] |= 1u << (hdr.seq % 8);
        ++rx->next_seq; /* here: how many arrived */
    }

    if ((hdr.length != length) ||
        (length != check_msg_size(ctx, CHECK_KIND_AM, ctx->rx_dir,
                                  hdr.seq))) {
        check_fail(ctx, UCS_ERR_IO_ERROR, "am: message %" PRIu64 " (seed %"
                   PRIu64 ") has %zu bytes, its header says %" PRIu64
                   ", expected %zu", hdr.seq, ctx->opts.seed, length,
                   hdr.length, check_msg_size(ctx, CHECK_KIND_AM,
                                              ctx->rx_dir, hdr.seq));
        return UCS_OK;
    }

    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        ++rx->eager;
        if (check_msg(ctx, CHECK_KIND_AM, ctx->rx_dir, hdr.seq, data,
                      length) == UCS_OK) {
            ++rx->checked;
            rx->bytes += length;
        }
        return UCS_OK;
    }

    ++rx->rndv;
    rndv = calloc(1, sizeof(*rndv));
    if (rndv != NULL) {
        rndv->buf = malloc(length);
    }
    if ((rndv == NULL) || (rndv->buf == NULL)) {
        free(rndv);
        check_fail(ctx, UCS_ERR_NO_MEMORY, "am: no memory for %zu bytes",
                   length);
        return UCS_OK;
    }
    rndv->ctx  = ctx;
    rndv->seq  = hdr.seq;
    rndv->size = length;
    check_msg_fill(ctx, CHECK_KIND_AM, ctx->rx_dir, hdr.seq, rndv->buf,
                   length, 0xff);

    memset(&rparam, 0, sizeof(rparam));
    rparam.op_attr_mask     = UCP_OP_ATTR_FIELD_CALLBACK |
                              UCP_OP_ATTR_FIELD_USER_DATA |
                              UCP_OP_ATTR_FIELD_RECV_INFO;
    rparam.cb.recv_am       = check_am_data_cb;
    rparam.user_data        = rndv;
    rparam.recv_info.length = &rndv->length;

    ++rx->rndv_inflight;
    ptr = ucp_am_recv_data_nbx(ctx->worker, data, rndv->buf, length, &rparam);
    if (ptr == NULL) {
        check_am_rndv_done(rndv, UCS_OK, rndv->length);
    } else if (UCS_PTR_IS_ERR(ptr)) {
        check_am_rndv_done(rndv, UCS_PTR_STATUS(ptr), 0);
    }
    return UCS_INPROGRESS;
}

static void check_describe_window(const check_op_t *ops, unsigned window,
                                  uint64_t posted, uint64_t retired,
                                  char *buf, size_t max)
{
    const check_op_t *op;

    if (retired == posted) {
        snprintf(buf, max, "none in flight");
        return;
    }
    op = &ops[retired % window];
    snprintf(buf, max, "%" PRIu64 " in flight, the oldest #%" PRIu64
             " (size %zu) %s", posted - retired, op->iter, op->size,
             op->done ? "completed" : "not completed");
}

static ucs_status_t check_stream_phase(check_ctx_t *ctx, check_kind_t kind,
                                       check_result_t *res)
{
    const unsigned window = ctx->opts.window;
    const uint64_t n      = ctx->opts.iters;
    uint64_t tx_posted    = 0, tx_retired = 0;
    uint64_t rx_posted    = 0, rx_retired = 0;
    char tx_text[128], rx_text[160], state[400];
    check_am_rx_t *am_rx  = &ctx->am_rx;
    ucs_status_t status;
    check_op_t *op;
    int busy;

    for (;;) {
        busy = 0;

        while ((tx_posted < n) && (tx_posted - tx_retired < window)) {
            op     = &ctx->tx_ops[tx_posted % window];
            status = check_stream_send(ctx, kind, op, tx_posted);
            if (status != UCS_OK) {
                return check_fail(ctx, status, "%s send of message %" PRIu64
                                  " (size %zu): %s", check_kind_names[kind],
                                  tx_posted, op->size,
                                  ucs_status_string(status));
            }
            ++tx_posted;
            busy = 1;
        }

        while ((tx_retired < tx_posted) &&
               ctx->tx_ops[tx_retired % window].done) {
            op = &ctx->tx_ops[tx_retired % window];
            if (op->status != UCS_OK) {
                return check_fail(ctx, op->status, "%s send of message %"
                                  PRIu64 " (size %zu, seed %" PRIu64 "): %s",
                                  check_kind_names[kind], op->iter, op->size,
                                  ctx->opts.seed,
                                  ucs_status_string(op->status));
            }
            ++res->tx_count;
            res->tx_bytes += op->size;
            ++tx_retired;
            busy = 1;
        }

        if (kind == CHECK_KIND_TAG) {
            while ((rx_posted < n) && (rx_posted - rx_retired < window)) {
                op     = &ctx->rx_ops[rx_posted % window];
                status = check_stream_recv(ctx, op, rx_posted);
                if (status != UCS_OK) {
                    return check_fail(ctx, status, "tag receive of message %"
                                      PRIu64 ": %s", rx_posted,
                                      ucs_status_string(status));
                }
                ++rx_posted;
                busy = 1;
            }

            while ((rx_retired < rx_posted) &&
                   ctx->rx_ops[rx_retired % window].done) {
                op = &ctx->rx_ops[rx_retired % window];
                if (op->status != UCS_OK) {
                    return check_fail(ctx, op->status, "tag receive of "
                                      "message %" PRIu64 " (size %zu, seed %"
                                      PRIu64 "): %s", op->iter, op->size,
                                      ctx->opts.seed,
                                      ucs_status_string(op->status));
                }
                status = check_msg(ctx, kind, ctx->rx_dir, op->iter, op->buf,
                                   op->length);
                if (status != UCS_OK) {
                    return status;
                }
                ++res->rx_count;
                res->rx_bytes += op->length;
                ++rx_retired;
                busy = 1;
            }
        } else {
            rx_retired = am_rx->checked;
        }

        if ((tx_retired == n) && (rx_retired == n) &&
            ((kind == CHECK_KIND_TAG) || (am_rx->rndv_inflight == 0))) {
            break;
        }

        if (busy) {
            continue;
        }

        status = check_progress(ctx);
        if (status != UCS_OK) {
            check_describe_window(ctx->tx_ops, window, tx_posted, tx_retired,
                                  tx_text, sizeof(tx_text));
            if (kind == CHECK_KIND_TAG) {
                check_describe_window(ctx->rx_ops, window, rx_posted,
                                      rx_retired, rx_text, sizeof(rx_text));
            } else {
                snprintf(rx_text, sizeof(rx_text), "next due #%" PRIu64
                         ", %" PRIu64 " rendezvous receives in flight",
                         am_rx->next_seq, am_rx->rndv_inflight);
            }
            snprintf(state, sizeof(state), "%s (seed %" PRIu64 "): sent %"
                     PRIu64 "/%" PRIu64 " (%s), received and checked %" PRIu64
                     "/%" PRIu64 " (%s)", check_kind_names[kind],
                     ctx->opts.seed, tx_retired, n, tx_text, rx_retired, n,
                     rx_text);
            return check_stopped(ctx, status, state);
        }
    }

    if (kind == CHECK_KIND_AM) {
        res->rx_count = am_rx->checked;
        res->rx_bytes = am_rx->bytes;
        res->eager    = am_rx->eager;
        res->rndv     = am_rx->rndv;
    }
    return UCS_OK;
}


/*
 * put: one at a time, flushed, reported, checked by the server.
 */

static ucs_status_t check_put_client(check_ctx_t *ctx, check_result_t *res)
{
    check_op_t *put       = &ctx->tx_ops[0];
    check_op_t *flush     = &ctx->tx_ops[1];
    check_op_t *report_op = &ctx->tx_ops[2];
    check_op_t *reply_op  = &ctx->rx_ops[0];
    check_put_report_t report;
    check_put_reply_t reply;
    ucp_request_param_t param;
    ucs_status_t status;
    uint64_t key;
    uint64_t i;

    for (i = 0; i < ctx->opts.iters; ++i) {
        key          = check_key(ctx->opts.seed, CHECK_KIND_PUT, 0, i);
        put->iter    = i;
        put->size    = check_size(key, ctx->opts.max_size);
        put->offset  = check_offset(key, ctx->remote_size, put->size);
        check_pattern_fill(key, 0, put->buf, put->size, 0);

        snprintf(ctx->what, sizeof(ctx->what), "put %" PRIu64 "/%" PRIu64
                 " (offset %" PRIu64 ", length %zu, seed %" PRIu64 "): "
                 "waiting for ucp_put_nbx and ucp_ep_flush_nbx", i,
                 ctx->opts.iters, put->offset, put->size, ctx->opts.seed);

        check_op_reset(put);
        check_param_send(&param, put);
        status = check_op_started(put, ucp_put_nbx(ctx->ep, put->buf,
                                                   put->size,
                                                   ctx->remote_addr +
                                                   put->offset,
                                                   ctx->rkey, &param));
        if (status != UCS_OK) {
            return check_fail(ctx, status, "%s: ucp_put_nbx: %s", ctx->what,
                              ucs_status_string(status));
        }

        check_op_reset(flush);
        check_param_send(&param, flush);
        status = check_op_started(flush, ucp_ep_flush_nbx(ctx->ep, &param));
        if (status != UCS_OK) {
            return check_fail(ctx, status, "%s: ucp_ep_flush_nbx: %s",
                              ctx->what, ucs_status_string(status));
        }

        status = check_wait(ctx, put, flush);
        if (status != UCS_OK) {
            return status;
        }

        report.iter   = i;
        report.seed   = ctx->opts.seed;
        report.offset = put->offset;
        report.length = put->size;
        status = check_tag_recv(ctx, reply_op, &reply, sizeof(reply),
                                CHECK_TAG_PUT_REPLY);
        if (status == UCS_OK) {
            status = check_tag_send(ctx, report_op, &report, sizeof(report),
                                    CHECK_TAG_PUT_REPORT);
        }
        if (status != UCS_OK) {
            return check_fail(ctx, status, "put %" PRIu64 ": report: %s", i,
                              ucs_status_string(status));
        }

        snprintf(ctx->what, sizeof(ctx->what), "put %" PRIu64 "/%" PRIu64
                 " (offset %" PRIu64 ", length %zu, seed %" PRIu64 "): "
                 "flushed, waiting for the server's verdict", i,
                 ctx->opts.iters, put->offset, put->size, ctx->opts.seed);
        status = check_wait(ctx, report_op, reply_op);
        if (status != UCS_OK) {
            return status;
        }

        if ((reply_op->length != sizeof(reply)) || (reply.iter != i)) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "put %" PRIu64 ": a "
                              "reply of %zu bytes for put %" PRIu64, i,
                              reply_op->length, reply.iter);
        } else if (reply.invalid) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "put %" PRIu64 ": the "
                              "server did not accept the report", i);
        } else if (reply.bad != 0) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "put %" PRIu64 " (offset "
                              "%" PRIu64 ", length %zu, seed %" PRIu64 "): "
                              "the server found %" PRIu64 " bytes wrong, the "
                              "first at region offset %" PRIu64 " (put offset "
                              "%+" PRId64 "): expected 0x%02x, got 0x%02x; "
                              "the last at region offset %" PRIu64, i,
                              put->offset, put->size, ctx->opts.seed,
                              reply.bad, reply.first,
                              (int64_t)(reply.first - put->offset),
                              reply.expected, reply.got, reply.last);
        }

        ++res->tx_count;
        res->tx_bytes += put->size;
    }
    return UCS_OK;
}

/* Compares the region with its shadow; returns the bytes that differ */
static uint64_t check_region_cmp(const check_ctx_t *ctx,
                                 check_put_reply_t *reply)
{
    size_t i;

    if (memcmp(ctx->region, ctx->shadow, ctx->region_size) == 0) {
        return 0;
    }

    for (i = 0; i < ctx->region_size; ++i) {
        if (ctx->region[i] != ctx->shadow[i]) {
            if (reply->bad == 0) {
                reply->first    = i;
                reply->expected = ctx->shadow[i];
                reply->got      = ctx->region[i];
            }
            reply->last = i;
            ++reply->bad;
        }
    }
    return reply->bad;
}

static ucs_status_t check_put_server(check_ctx_t *ctx, check_result_t *res)
{
    check_op_t *report_op = &ctx->rx_ops[0];
    check_op_t *reply_op  = &ctx->tx_ops[0];
    check_put_report_t report;
    check_put_reply_t reply;
    ucs_status_t status;
    uint64_t i;

    for (i = 0; i < ctx->opts.iters; ++i) {
        snprintf(ctx->what, sizeof(ctx->what), "put %" PRIu64 "/%" PRIu64
                 " (seed %" PRIu64 "): waiting for the client's report", i,
                 ctx->opts.iters, ctx->opts.seed);
        memset(&report, 0, sizeof(report));
        status = check_tag_recv(ctx, report_op, &report, sizeof(report),
                                CHECK_TAG_PUT_REPORT);
        if (status == UCS_OK) {
            status = check_wait(ctx, report_op, NULL);
        }
        if (status != UCS_OK) {
            return status;
        }

        memset(&reply, 0, sizeof(reply));
        reply.iter = i;
        if ((report_op->length != sizeof(report)) || (report.iter != i) ||
            (report.seed != ctx->opts.seed) ||
            (report.length > ctx->region_size) ||
            (report.offset > ctx->region_size - report.length)) {
            reply.invalid = 1;
        } else {
            check_pattern_fill(check_key(report.seed, CHECK_KIND_PUT, 0, i),
                               0, ctx->shadow + report.offset, report.length,
                               0);
            check_region_cmp(ctx, &reply);
        }

        /* the verdict goes to the client whatever it is */
        snprintf(ctx->what, sizeof(ctx->what), "put %" PRIu64 "/%" PRIu64
                 " (offset %" PRIu64 ", length %" PRIu64 ", seed %" PRIu64
                 "): sending the verdict", i, ctx->opts.iters, report.offset,
                 report.length, ctx->opts.seed);
        status = check_tag_send(ctx, reply_op, &reply, sizeof(reply),
                                CHECK_TAG_PUT_REPLY);
        if (status == UCS_OK) {
            status = check_wait(ctx, reply_op, NULL);
        }
        if (status != UCS_OK) {
            return status;
        }

        if (reply.invalid) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "put %" PRIu64 ": "
                              "invalid report (%zu bytes): put %" PRIu64
                              ", seed %" PRIu64 ", offset %" PRIu64
                              ", length %" PRIu64, i, report_op->length,
                              report.iter, report.seed, report.offset,
                              report.length);
        } else if (reply.bad != 0) {
            return check_fail(ctx, UCS_ERR_IO_ERROR, "put %" PRIu64
                              " (offset %" PRIu64 ", length %" PRIu64
                              ", seed %" PRIu64 "): %" PRIu64 " bytes of the "
                              "region wrong, the first at offset %" PRIu64
                              " (put offset %+" PRId64 "): expected 0x%02x, "
                              "got 0x%02x; the last at offset %" PRIu64, i,
                              report.offset, report.length, report.seed,
                              reply.bad, reply.first,
                              (int64_t)(reply.first - report.offset),
                              reply.expected, reply.got, reply.last);
        }

        ++res->rx_count;
        res->rx_bytes += report.length;
    }
    return UCS_OK;
}


/*
 * get: a window of reads of random ranges of the server's region.
 */

static ucs_status_t check_get_client(check_ctx_t *ctx, check_result_t *res)
{
    const unsigned window = ctx->opts.window;
    const uint64_t n      = ctx->opts.iters;
    const uint64_t gkey   = check_key(ctx->opts.seed, CHECK_KIND_GET, 0, 0);
    uint64_t posted       = 0, retired = 0;
    ucp_request_param_t param;
    ucs_status_t status;
    check_diff_t diff;
    char text[160], state[320];
    check_op_t *op;
    uint64_t key;
    int busy;

    while (retired < n) {
        busy = 0;

        while ((posted < n) && (posted - retired < window)) {
            op         = &ctx->rx_ops[posted % window];
            key        = check_key(ctx->opts.seed, CHECK_KIND_GET, 1, posted);
            op->iter   = posted;
            op->size   = check_size(key, ctx->opts.max_size);
            op->offset = check_offset(key, ctx->remote_size, op->size);
            check_pattern_fill(gkey, op->offset, op->buf, op->size, 0xff);

            check_op_reset(op);
            check_param_send(&param, op);
            status = check_op_started(op, ucp_get_nbx(ctx->ep, op->buf,
                                                      op->size,
                                                      ctx->remote_addr +
                                                      op->offset, ctx->rkey,
                                                      &param));
            if (status != UCS_OK) {
                return check_fail(ctx, status, "get %" PRIu64 " (offset %"
                                  PRIu64 ", length %zu): ucp_get_nbx: %s",
                                  posted, op->offset, op->size,
                                  ucs_status_string(status));
            }
            ++posted;
            busy = 1;
        }

        while ((retired < posted) && ctx->rx_ops[retired % window].done) {
            op = &ctx->rx_ops[retired % window];
            if (op->status != UCS_OK) {
                return check_fail(ctx, op->status, "get %" PRIu64 " (offset "
                                  "%" PRIu64 ", length %zu, seed %" PRIu64
                                  "): %s", op->iter, op->offset, op->size,
                                  ctx->opts.seed,
                                  ucs_status_string(op->status));
            }
            if (check_pattern_cmp(gkey, op->offset, op->buf, op->size,
                                  &diff) != 0) {
                return check_fail(ctx, UCS_ERR_IO_ERROR, "get %" PRIu64
                                  " (offset %" PRIu64 ", length %zu, seed %"
                                  PRIu64 "): %" PRIu64 " bytes wrong, the "
                                  "first at region offset %" PRIu64 " (get "
                                  "offset %" PRIu64 "): expected 0x%02x, got "
                                  "0x%02x; the last at region offset %" PRIu64,
                                  op->iter, op->offset, op->size,
                                  ctx->opts.seed, diff.count, diff.first,
                                  diff.first - op->offset, diff.expected,
                                  diff.got, diff.last);
            }
            ++res->rx_count;
            res->rx_bytes += op->size;
            ++retired;
            busy = 1;
        }

        if (busy) {
            continue;
        }

        status = check_progress(ctx);
        if (status != UCS_OK) {
            check_describe_window(ctx->rx_ops, window, posted, retired, text,
                                  sizeof(text));
            op = &ctx->rx_ops[retired % window];
            snprintf(state, sizeof(state), "get (seed %" PRIu64 "): "
                     "completed %" PRIu64 "/%" PRIu64 ", %s at offset %"
                     PRIu64, ctx->opts.seed, retired, n, text, op->offset);
            return check_stopped(ctx, status, state);
        }
    }
    return UCS_OK;
}


/*
 * Setup and teardown.
 */

static void check_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    check_ctx_t *ctx = arg;

    (void)ep;
    if (ctx->closing) {
        check_log(ctx, "endpoint error while closing (ignored): %s",
                  ucs_status_string(status));
        return;
    }
    check_fail(ctx, status, "endpoint error: %s%s", ucs_status_string(status),
               check_peer_failed(ctx) ? " (the peer had reported a failure "
                                        "or exited)" : "");
}

static ucs_status_t check_ucp_init(check_ctx_t *ctx)
{
    ucp_am_handler_param_t am_param;
    ucp_worker_params_t wparams;
    ucp_params_t params;
    ucp_config_t *config;
    ucs_status_t status;

    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_config_read: %s",
                          ucs_status_string(status));
    }

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features   = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_RMA;
    status            = ucp_init(&params, config, &ctx->context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_init: %s",
                          ucs_status_string(status));
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    status = ucp_worker_create(ctx->context, &wparams, &ctx->worker);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_worker_create: %s",
                          ucs_status_string(status));
    }

    memset(&am_param, 0, sizeof(am_param));
    am_param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                          UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                          UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am_param.id         = CHECK_AM_ID;
    am_param.flags      = UCP_AM_FLAG_WHOLE_MSG;
    am_param.cb         = check_am_cb;
    am_param.arg        = ctx;
    status = ucp_worker_set_am_recv_handler(ctx->worker, &am_param);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_worker_set_am_recv_handler: %s",
                          ucs_status_string(status));
    }
    return UCS_OK;
}

static ucs_status_t check_region_map(check_ctx_t *ctx)
{
    ucp_mem_map_params_t params;
    ucs_status_t status;

    ctx->region_size = 2 * ctx->opts.max_size;
    if (ctx->region_size < CHECK_MIN_REGION) {
        ctx->region_size = CHECK_MIN_REGION;
    }
    if ((posix_memalign((void**)&ctx->region, 4096, ctx->region_size) != 0) ||
        ((ctx->shadow = malloc(ctx->region_size)) == NULL)) {
        return check_fail(ctx, UCS_ERR_NO_MEMORY, "no memory for a region "
                          "of %zu bytes", ctx->region_size);
    }
    memset(ctx->region, 0, ctx->region_size);

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                        UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address    = ctx->region;
    params.length     = ctx->region_size;
    status            = ucp_mem_map(ctx->context, &params, &ctx->memh);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_mem_map of %zu bytes: %s",
                          ctx->region_size, ucs_status_string(status));
    }

    status = ucp_rkey_pack(ctx->context, ctx->memh, &ctx->rkey_buf,
                           &ctx->rkey_length);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_rkey_pack: %s",
                          ucs_status_string(status));
    }
    return UCS_OK;
}

static ucs_status_t check_ep_create(check_ctx_t *ctx,
                                    const ucp_address_t *address)
{
    ucp_ep_params_t params;
    ucs_status_t status;

    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address         = address;
    params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb  = check_ep_err_cb;
    params.err_handler.arg = ctx;
    status = ucp_ep_create(ctx->worker, &params, &ctx->ep);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_ep_create: %s",
                          ucs_status_string(status));
    }
    return UCS_OK;
}

/* Exchanges parameters, worker addresses and the region; connects */
static ucs_status_t check_exchange(check_ctx_t *ctx)
{
    check_welcome_t welcome = {0};
    check_hello_t hello     = {0};
    ucp_worker_attr_t attr;
    ucs_status_t status;
    void *peer_addr     = NULL;
    void *rkey_buf      = NULL;

    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    status          = ucp_worker_query(ctx->worker, &attr);
    if (status != UCS_OK) {
        return check_fail(ctx, status, "ucp_worker_query: %s",
                          ucs_status_string(status));
    }

    if (!ctx->is_server) {
        hello.magic       = CHECK_MAGIC;
        hello.iters       = ctx->opts.iters;
        hello.seed        = ctx->opts.seed;
        hello.max_size    = ctx->opts.max_size;
        hello.kinds       = ctx->opts.kinds;
        hello.addr_length = attr.address_length;
        status = check_sock_send(ctx, &hello, sizeof(hello));
        if (status == UCS_OK) {
            status = check_sock_send(ctx, attr.address, attr.address_length);
        }
        if (status == UCS_OK) {
            status = check_sock_recv(ctx, &welcome, sizeof(welcome),
                                     "waiting for the server's address");
        }
        if ((status == UCS_OK) && ((welcome.magic != CHECK_MAGIC) ||
                                   (welcome.addr_length > (1u << 20)) ||
                                   (welcome.rkey_length > (1u << 20)))) {
            status = check_fail(ctx, UCS_ERR_INVALID_PARAM, "bad reply from "
                                "the server");
        }
        if (status == UCS_OK) {
            peer_addr = malloc(welcome.addr_length);
            rkey_buf  = malloc(welcome.rkey_length + 1);
            if ((peer_addr == NULL) || (rkey_buf == NULL)) {
                status = check_fail(ctx, UCS_ERR_NO_MEMORY, "no memory");
            }
        }
        if (status == UCS_OK) {
            status = check_sock_recv(ctx, peer_addr, welcome.addr_length,
                                     "receiving the server's address");
        }
        if (status == UCS_OK) {
            status = check_sock_recv(ctx, rkey_buf, welcome.rkey_length,
                                     "receiving the server's rkey");
        }
        if (status == UCS_OK) {
            status = check_ep_create(ctx, peer_addr);
        }
        if (status == UCS_OK) {
            ctx->remote_addr = welcome.region_addr;
            ctx->remote_size = welcome.region_size;
            if (ctx->remote_size < ctx->opts.max_size) {
                status = check_fail(ctx, UCS_ERR_INVALID_PARAM, "the server's "
                                    "region (%zu bytes) is smaller than -m",
                                    ctx->remote_size);
            }
        }
        if (status == UCS_OK) {
            status = ucp_ep_rkey_unpack(ctx->ep, rkey_buf, &ctx->rkey);
            if (status != UCS_OK) {
                check_fail(ctx, status, "ucp_ep_rkey_unpack: %s",
                           ucs_status_string(status));
            }
        }
    } else {
        status = check_sock_recv(ctx, &hello, sizeof(hello),
                                 "waiting for the client's parameters");
        if ((status == UCS_OK) &&
            ((hello.magic != CHECK_MAGIC) || (hello.addr_length > (1u << 20)) ||
             (hello.max_size == 0) || (hello.max_size > (1ul << 30)) ||
             (hello.kinds == 0))) {
            status = check_fail(ctx, UCS_ERR_INVALID_PARAM, "bad hello from "
                                "the client");
        }
        if (status == UCS_OK) {
            /* the client's parameters rule */
            ctx->opts.iters    = hello.iters;
            ctx->opts.seed     = hello.seed;
            ctx->opts.max_size = hello.max_size;
            ctx->opts.kinds    = (unsigned)hello.kinds;
            peer_addr          = malloc(hello.addr_length);
            if (peer_addr == NULL) {
                status = check_fail(ctx, UCS_ERR_NO_MEMORY, "no memory");
            }
        }
        if (status == UCS_OK) {
            status = check_sock_recv(ctx, peer_addr, hello.addr_length,
                                     "receiving the client's address");
        }
        if (status == UCS_OK) {
            status = check_region_map(ctx);
        }
        if (status == UCS_OK) {
            welcome.magic       = CHECK_MAGIC;
            welcome.region_addr = (uintptr_t)ctx->region;
            welcome.region_size = ctx->region_size;
            welcome.addr_length = attr.address_length;
            welcome.rkey_length = ctx->rkey_length;
            status = check_sock_send(ctx, &welcome, sizeof(welcome));
        }
        if (status == UCS_OK) {
            status = check_sock_send(ctx, attr.address, attr.address_length);
        }
        if (status == UCS_OK) {
            status = check_sock_send(ctx, ctx->rkey_buf, ctx->rkey_length);
        }
        if (status == UCS_OK) {
            status = check_ep_create(ctx, peer_addr);
        }
    }

    ucp_worker_release_address(ctx->worker, attr.address);
    free(peer_addr);
    free(rkey_buf);
    return status;
}

static ucs_status_t check_buffers_alloc(check_ctx_t *ctx)
{
    unsigned i;

    for (i = 0; i < ctx->opts.window; ++i) {
        ctx->tx_ops[i].buf = malloc(ctx->opts.max_size);
        ctx->rx_ops[i].buf = malloc(ctx->opts.max_size);
        if ((ctx->tx_ops[i].buf == NULL) || (ctx->rx_ops[i].buf == NULL)) {
            return check_fail(ctx, UCS_ERR_NO_MEMORY, "no memory for "
                              "buffers of %zu bytes", ctx->opts.max_size);
        }
    }
    return UCS_OK;
}

/* Closes the endpoint after the last check; a problem here is only noted */
static ucs_status_t check_close(check_ctx_t *ctx)
{
    ucp_request_param_t param;
    ucs_status_ptr_t ptr;
    ucs_status_t status;
    check_op_t op;

    ctx->closing = 1;
    if (ctx->rkey != NULL) {
        ucp_rkey_destroy(ctx->rkey);
        ctx->rkey = NULL;
    }

    check_op_reset(&op);
    check_param_send(&param, &op);
    ptr = ucp_ep_close_nbx(ctx->ep, &param);
    check_op_started(&op, ptr);
    snprintf(ctx->what, sizeof(ctx->what), "closing the endpoint "
             "(ucp_ep_close_nbx, flush mode)");
    while (!op.done) {
        status = check_progress(ctx);
        if (status == UCS_ERR_TIMED_OUT) {
            return check_timeout(ctx, "%s", ctx->what);
        }
    }
    ctx->ep = NULL;
    if (op.status != UCS_OK) {
        check_log(ctx, "note: ucp_ep_close_nbx: %s",
                  ucs_status_string(op.status));
    }

    /* the peer may need our progress to close its side */
    return check_barrier(ctx, "the barrier after closing the endpoints");
}

static void check_cleanup(check_ctx_t *ctx)
{
    unsigned i;

    if (ctx->rkey_buf != NULL) {
        ucp_rkey_buffer_release(ctx->rkey_buf);
    }
    if (ctx->memh != NULL) {
        ucp_mem_unmap(ctx->context, ctx->memh);
    }
    if (ctx->worker != NULL) {
        ucp_worker_destroy(ctx->worker);
    }
    if (ctx->context != NULL) {
        ucp_cleanup(ctx->context);
    }
    for (i = 0; i < CHECK_MAX_WINDOW; ++i) {
        free(ctx->tx_ops[i].buf);
        free(ctx->rx_ops[i].buf);
    }
    free(ctx->region);
    free(ctx->shadow);
    free(ctx->am_rx.seen);
    if (ctx->sock >= 0) {
        close(ctx->sock);
    }
}


/*
 * Phases and summary.
 */

/* The server's part before the start barrier */
static void check_phase_prepare(check_ctx_t *ctx, check_kind_t kind)
{
    if (kind == CHECK_KIND_AM) {
        free(ctx->am_rx.seen);
        memset(&ctx->am_rx, 0, sizeof(ctx->am_rx));
        ctx->am_rx.seen = calloc((ctx->opts.iters + 7) / 8, 1);
    } else if (ctx->is_server && (kind == CHECK_KIND_PUT)) {
        check_pattern_fill(check_key(ctx->opts.seed, CHECK_KEY_PUT_INIT, 0,
                                     0), 0, ctx->region, ctx->region_size, 0);
        memcpy(ctx->shadow, ctx->region, ctx->region_size);
    } else if (ctx->is_server && (kind == CHECK_KIND_GET)) {
        check_pattern_fill(check_key(ctx->opts.seed, CHECK_KIND_GET, 0, 0),
                           0, ctx->region, ctx->region_size, 0);
    }
}

static ucs_status_t check_phase(check_ctx_t *ctx, check_kind_t kind,
                                check_result_t *res)
{
    char what[64];
    ucs_status_t status;
    double t0;

    snprintf(what, sizeof(what), "the barrier before %s",
             check_kind_names[kind]);
    check_set_phase(ctx, what);
    check_phase_prepare(ctx, kind);
    status = check_barrier(ctx, what);
    if (status != UCS_OK) {
        return status;
    }

    check_set_phase(ctx, check_kind_names[kind]);
    t0 = check_now();
    switch (kind) {
    case CHECK_KIND_TAG:
    case CHECK_KIND_AM:
        status = check_stream_phase(ctx, kind, res);
        break;
    case CHECK_KIND_PUT:
        status = ctx->is_server ? check_put_server(ctx, res) :
                                  check_put_client(ctx, res);
        break;
    case CHECK_KIND_GET:
        status = ctx->is_server ? UCS_OK : check_get_client(ctx, res);
        break;
    default:
        status = UCS_ERR_INVALID_PARAM;
        break;
    }
    res->seconds = check_now() - t0;
    res->ran     = 1;
    if (status != UCS_OK) {
        return status;
    }

    snprintf(what, sizeof(what), "the barrier after %s",
             check_kind_names[kind]);
    check_set_phase(ctx, what);
    return check_barrier(ctx, what);
}

static void check_summary(const check_ctx_t *ctx, check_kind_t kind,
                          const check_result_t *res)
{
    double mb  = (res->tx_bytes + res->rx_bytes) / CHECK_MB;
    double sec = (res->seconds > 0) ? res->seconds : 1e-9;

    switch (kind) {
    case CHECK_KIND_TAG:
    case CHECK_KIND_AM:
        if (kind == CHECK_KIND_AM) {
            check_log(ctx, "%-3s: sent %" PRIu64 " (%.1f MB), received %"
                      PRIu64 " (%.1f MB; eager %" PRIu64 ", rndv %" PRIu64
                      "), %.2f s, %.1f MB/s", check_kind_names[kind],
                      res->tx_count, res->tx_bytes / CHECK_MB, res->rx_count,
                      res->rx_bytes / CHECK_MB, res->eager, res->rndv, sec,
                      mb / sec);
        } else {
            check_log(ctx, "%-3s: sent %" PRIu64 " (%.1f MB), received %"
                      PRIu64 " (%.1f MB), %.2f s, %.1f MB/s",
                      check_kind_names[kind], res->tx_count,
                      res->tx_bytes / CHECK_MB, res->rx_count,
                      res->rx_bytes / CHECK_MB, sec, mb / sec);
        }
        break;
    case CHECK_KIND_PUT:
        if (ctx->is_server) {
            check_log(ctx, "put: checked %" PRIu64 " puts (%.1f MB) against "
                      "the whole region", res->rx_count, mb);
        } else {
            check_log(ctx, "put: %" PRIu64 " puts (%.1f MB), each flushed "
                      "and checked by the server, %.2f s, %.1f MB/s",
                      res->tx_count, mb, sec, mb / sec);
        }
        break;
    case CHECK_KIND_GET:
        if (ctx->is_server) {
            check_log(ctx, "get: served (the client checks)");
        } else {
            check_log(ctx, "get: %" PRIu64 " gets (%.1f MB), %.2f s, "
                      "%.1f MB/s", res->rx_count, mb, sec, mb / sec);
        }
        break;
    default:
        break;
    }
}


/*
 * Options.
 */

static int check_parse_size(const char *str, size_t *size_p)
{
    unsigned long long value;
    char *end;

    errno = 0;
    value = strtoull(str, &end, 0);
    if ((errno != 0) || (end == str)) {
        return -1;
    }
    if ((*end == 'k') || (*end == 'K')) {
        value <<= 10;
        ++end;
    } else if ((*end == 'm') || (*end == 'M')) {
        value <<= 20;
        ++end;
    }
    if (*end != '\0') {
        return -1;
    }
    *size_p = value;
    return 0;
}

static int check_parse_kinds(const char *str, unsigned *kinds_p)
{
    char buf[64], *tok, *save;
    unsigned kinds = 0;
    unsigned k;

    snprintf(buf, sizeof(buf), "%s", str);
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        for (k = 0; k < CHECK_KIND_LAST; ++k) {
            if (strcmp(tok, check_kind_names[k]) == 0) {
                break;
            }
        }
        if (k == CHECK_KIND_LAST) {
            return -1;
        }
        kinds |= 1u << k;
    }
    if (kinds == 0) {
        return -1;
    }
    *kinds_p = kinds;
    return 0;
}

static void check_usage(void)
{
    fprintf(stderr,
            "usage: ucp_check [-p port] [-l listen address] [-n iterations] "
            "[-s seed]\n"
            "                 [-m max size] [-k tag,am,put,get] [-w window] "
            "[-t timeout] [-u]\n"
            "                 [server IPv4 address]\n");
}

static int check_parse_opts(check_opts_t *opts, int argc, char **argv)
{
    unsigned long value;
    char *end;
    int c;

    opts->peer        = NULL;
    opts->listen_addr = "0.0.0.0";
    opts->port        = CHECK_DEFAULT_PORT;
    opts->iters       = CHECK_DEFAULT_ITERS;
    opts->seed        = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    opts->max_size    = CHECK_DEFAULT_MAX_SIZE;
    opts->timeout     = CHECK_DEFAULT_TIMEOUT;
    opts->window      = CHECK_DEFAULT_WINDOW;
    opts->kinds       = (1u << CHECK_KIND_LAST) - 1;
    opts->am_any_order = 0;

    while ((c = getopt(argc, argv, "p:l:n:s:m:k:w:t:uh")) != -1) {
        if ((c == 'p') || (c == 'n') || (c == 's') || (c == 'w') ||
            (c == 't')) {
            errno = 0;
            value = strtoul(optarg, &end, 0);
            if ((errno != 0) || (end == optarg) || (*end != '\0')) {
                check_usage();
                return -1;
            }
        } else {
            value = 0;
        }

        switch (c) {
        case 'p':
            if ((value == 0) || (value > 65535)) {
                goto bad;
            }
            opts->port = (uint16_t)value;
            break;
        case 'l':
            opts->listen_addr = optarg;
            break;
        case 'n':
            opts->iters = value;
            break;
        case 's':
            opts->seed = value;
            break;
        case 'm':
            if ((check_parse_size(optarg, &opts->max_size) != 0) ||
                (opts->max_size == 0) || (opts->max_size > (1ul << 30))) {
                goto bad;
            }
            break;
        case 'k':
            if (check_parse_kinds(optarg, &opts->kinds) != 0) {
                goto bad;
            }
            break;
        case 'w':
            if ((value == 0) || (value > CHECK_MAX_WINDOW)) {
                goto bad;
            }
            opts->window = (unsigned)value;
            break;
        case 't':
            if ((value == 0) || (value > 86400)) {
                goto bad;
            }
            opts->timeout = (unsigned)value;
            break;
        case 'u':
            opts->am_any_order = 1;
            break;
        default:
            goto bad;
        }
    }

    if (optind < argc) {
        opts->peer = argv[optind++];
    }
    if (optind < argc) {
        goto bad;
    }
    return 0;

bad:
    check_usage();
    return -1;
}


int main(int argc, char **argv)
{
    check_result_t results[CHECK_KIND_LAST];
    ucs_status_t status = UCS_OK;
    check_ctx_t ctx;
    unsigned kind;
    char kinds[32];

    memset(&ctx, 0, sizeof(ctx));
    memset(results, 0, sizeof(results));
    ctx.sock = -1;
    if (check_parse_opts(&ctx.opts, argc, argv) != 0) {
        return 2;
    }

    setvbuf(stdout, NULL, _IOLBF, 0);
    ctx.is_server = (ctx.opts.peer == NULL);
    ctx.role      = ctx.is_server ? "server" : "client";
    ctx.tx_dir    = ctx.is_server ? CHECK_DIR_S2C : CHECK_DIR_C2S;
    ctx.rx_dir    = ctx.is_server ? CHECK_DIR_C2S : CHECK_DIR_S2C;
    ctx.start     = check_now();
    ctx.deadline  = ctx.start + ctx.opts.timeout;

    check_set_phase(&ctx, "setup");
    signal(SIGALRM, check_alarm_handler);
    alarm(ctx.opts.timeout + CHECK_ALARM_GRACE);

    status = check_sock_open(&ctx);
    if (status == UCS_OK) {
        status = check_ucp_init(&ctx);
    }
    if (status == UCS_OK) {
        status = check_exchange(&ctx);
    }
    if (status == UCS_OK) {
        status = check_buffers_alloc(&ctx);
    }

    if (status == UCS_OK) {
        kinds[0] = '\0';
        for (kind = 0; kind < CHECK_KIND_LAST; ++kind) {
            if (ctx.opts.kinds & (1u << kind)) {
                snprintf(kinds + strlen(kinds), sizeof(kinds) - strlen(kinds),
                         "%s%s", kinds[0] ? "," : "", check_kind_names[kind]);
            }
        }
        check_log(&ctx, "connected; kinds %s, %" PRIu64 " iterations each, "
                  "seed %" PRIu64 ", sizes 1..%zu, window %u, timeout %u s",
                  kinds, ctx.opts.iters, ctx.opts.seed, ctx.opts.max_size,
                  ctx.opts.window, ctx.opts.timeout);
    }

    for (kind = 0; (status == UCS_OK) && (kind < CHECK_KIND_LAST); ++kind) {
        if (!(ctx.opts.kinds & (1u << kind))) {
            continue;
        }
        status = check_phase(&ctx, kind, &results[kind]);
        if (status == UCS_OK) {
            check_summary(&ctx, kind, &results[kind]);
        }
    }

    if (status == UCS_OK) {
        check_set_phase(&ctx, "closing");
        status = check_close(&ctx);
    }

    if ((status != UCS_OK) || ctx.failed) {
        check_log(&ctx, "FAIL (seed %" PRIu64 ", %.1f s)", ctx.opts.seed,
                  check_now() - ctx.start);
        /* no cleanup: UCX may wait for a peer that is gone */
        return 1;
    }

    alarm(0);
    check_cleanup(&ctx);
    check_log(&ctx, "PASS (seed %" PRIu64 ", %.1f s)", ctx.opts.seed,
              check_now() - ctx.start);
    return 0;
}
