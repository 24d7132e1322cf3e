/*
 * Content check for an MPI transport: two ranks exchange messages of random
 * sizes (1 byte up to -m bytes, log-uniform) in both directions, every
 * byte filled with a pattern derived from (seed, stream, message number,
 * byte index), and the receiver checks every byte, the size and the order.
 *
 *   phase 1, blocking: MPI_Send/MPI_Recv, a random direction per message;
 *   phase 2, non-blocking: both ranks stream -n messages to each other at
 *            once with MPI_Isend/MPI_Irecv, -w of each in flight.
 *
 * Receives take MPI_ANY_TAG into a buffer of the largest size; the tag
 * carries the message number, so a message arriving out of order, lost,
 * duplicated, truncated or with a wrong byte is reported (which message,
 * which byte, what was expected) and the job ends with MPI_Abort.
 *
 * Each rank also prints the UCX libraries mapped into it (from
 * /proc/self/maps) and its network namespace, so the caller can check
 * which UCX build the ranks really ran on.
 *
 *   mpirun -np 2 mpi_check [-n MESSAGES] [-m MAX_SIZE] [-w WINDOW] [-s SEED]
 *                          [-c NUM] [-t SECONDS]
 *
 * -c NUM tests the checker itself: each sender flips the last byte of its
 * message NUM in both phases, and the run must fail.
 * -t SECONDS: a rank that completes no message for this long prints where
 * it stands (phase, messages sent and received, sizes of the ones pending)
 * on stderr and exits with status 5, so a stall is reported, not just a
 * timeout. A rank killed with SIGTERM (mpirun's timeout) prints the same.
 *
 * Rank 0 prints one summary line starting "mpi_check: PASS" on success.
 */
#include <mpi.h>

#include <signal.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STREAM_BLOCKING 2 /* streams 0 and 1: rank r -> rank 1-r, phase 2 */

static uint64_t seed = 1;
static int rank;
static int64_t corrupt = -1; /* -c: message whose last byte is flipped */

/* Where the run stands, for the stall report of -t */
#define NONE UINT64_MAX
static struct {
    const char *volatile phase;
    volatile int         send_stream, recv_stream;
    volatile uint64_t    sent, received;       /* completed so far */
    volatile uint64_t    send_wait, recv_wait; /* oldest pending, or NONE */
    size_t               max_size;
    unsigned             stall_timeout;
} progress = {"start", 0, 0, 0, 0, NONE, NONE, 0, 0};

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finalizer */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t msg_key(int stream, uint64_t num)
{
    return mix64(mix64(seed) ^ ((uint64_t)stream << 56) ^
                 (num * 0xd6e8feb86659fd93ull));
}

/* Size of message <num> of <stream>: log-uniform over 1..max_size, with
 * max_size itself reasonably frequent */
static size_t msg_size(int stream, uint64_t num, size_t max_size)
{
    uint64_t r = mix64(msg_key(stream, num) ^ 0x5a5a5a5a5a5a5a5aull);
    int      bits = 0;
    size_t   size;

    while (((size_t)2 << bits) <= max_size) {
        bits++;
    }
    /* bits = floor(log2(max_size)); pick an octave 0..bits */
    bits = (int)(r % (uint64_t)(bits + 1));
    size = ((size_t)1 << bits) + (size_t)((r >> 8) % ((uint64_t)1 << bits));
    return (size > max_size) ? max_size : size;
}

static size_t append_str(char *buf, size_t pos, size_t len, const char *s)
{
    while (*s && (pos + 1 < len)) {
        buf[pos++] = *s++;
    }
    buf[pos] = '\0';
    return pos;
}

static size_t append_u64(char *buf, size_t pos, size_t len, uint64_t v)
{
    char digits[24];
    int  n = 0;

    do {
        digits[n++] = (char)('0' + (v % 10));
        v /= 10;
    } while (v != 0);
    while ((n > 0) && (pos + 1 < len)) {
        buf[pos++] = digits[--n];
    }
    buf[pos] = '\0';
    return pos;
}

/* "<what><message> (<size> bytes)", async-signal-safe like its callers */
static size_t append_wait(char *line, size_t pos, size_t len,
                          const char *what, int stream, uint64_t message)
{
    pos = append_str(line, pos, len, what);
    pos = append_u64(line, pos, len, message);
    pos = append_str(line, pos, len, " (");
    pos = append_u64(line, pos, len,
                     msg_size(stream, message, progress.max_size));
    return append_str(line, pos, len, " bytes)");
}

/* SIGALRM: no message completed for -t seconds; SIGTERM: killed (mpirun
 * timed out). Only async-signal-safe calls (msg_size is pure arithmetic). */
static void stall_handler(int sig)
{
    char   line[512];
    size_t pos = 0, len = sizeof(line);

    if (sig == SIGALRM) {
        pos = append_str(line, pos, len, "mpi_check: STALL: rank ");
        pos = append_u64(line, pos, len, (uint64_t)rank);
        pos = append_str(line, pos, len, ": no message completed for ");
        pos = append_u64(line, pos, len, progress.stall_timeout);
    } else {
        pos = append_str(line, pos, len, "mpi_check: KILLED: rank ");
        pos = append_u64(line, pos, len, (uint64_t)rank);
        pos = append_str(line, pos, len, ": signal ");
        pos = append_u64(line, pos, len, (uint64_t)sig);
    }
    pos = append_str(line, pos, len, (sig == SIGALRM) ? " s in the " :
                     " in the ");
    pos = append_str(line, pos, len, progress.phase);
    pos = append_str(line, pos, len, " phase; completed ");
    pos = append_u64(line, pos, len, progress.sent);
    pos = append_str(line, pos, len, " sends and ");
    pos = append_u64(line, pos, len, progress.received);
    pos = append_str(line, pos, len, " receives");
    if (progress.recv_wait != NONE) {
        pos = append_wait(line, pos, len, "; waiting to receive message ",
                          progress.recv_stream, progress.recv_wait);
    }
    if (progress.send_wait != NONE) {
        pos = append_wait(line, pos, len,
                          "; waiting to complete the send of message ",
                          progress.send_stream, progress.send_wait);
    }
    pos = append_str(line, pos, len, "\n");
    if (write(2, line, pos) < 0) {
        /* nothing left to do */
    }
    _exit((sig == SIGALRM) ? 5 : 128 + sig);
}

static void made_progress(void)
{
    if (progress.stall_timeout > 0) {
        alarm(progress.stall_timeout);
    }
}

/* The pattern word covering bytes 8*w .. 8*w+7 of a message */
static inline uint64_t pattern_word(uint64_t key, size_t w)
{
    return mix64(key ^ (w * 0x9e3779b97f4a7c15ull));
}

static void fill(unsigned char *buf, int stream, uint64_t num, size_t size)
{
    uint64_t key = msg_key(stream, num);
    size_t   i, b;
    uint64_t v;

    for (i = 0; i < size; i += 8) {
        v = pattern_word(key, i / 8);
        for (b = 0; (b < 8) && (i + b < size); b++) {
            buf[i + b] = (unsigned char)(v >> (8 * b));
        }
    }
    if ((int64_t)num == corrupt) {
        buf[size - 1] ^= 0x01;
    }
}

static void fail(const char *phase, int stream, uint64_t num, const char *fmt,
                 ...) __attribute__((format(printf, 4, 5)));

static void fail(const char *phase, int stream, uint64_t num, const char *fmt,
                 ...)
{
    va_list ap;

    fprintf(stderr, "mpi_check: FAIL: rank %d, %s phase, stream %d, message %"
            PRIu64 ": ", rank, phase, stream, num);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

/* Check a received message: tag (order), size and every byte */
static void check(const char *phase, const unsigned char *buf,
                  const MPI_Status *status, int stream, uint64_t num,
                  size_t max_size, int tag_mod)
{
    size_t   size = msg_size(stream, num, max_size);
    uint64_t key = msg_key(stream, num);
    int      count;
    size_t   i, b;
    uint64_t v;

    MPI_Get_count(status, MPI_BYTE, &count);
    if (status->MPI_TAG != (int)(num % (uint64_t)tag_mod)) {
        fail(phase, stream, num, "out of order: got tag %d, expected %d "
             "(%d bytes)", status->MPI_TAG, (int)(num % (uint64_t)tag_mod),
             count);
    }
    if ((count < 0) || ((size_t)count != size)) {
        fail(phase, stream, num, "got %d bytes, expected %zu", count, size);
    }
    for (i = 0; i < size; i += 8) {
        v = pattern_word(key, i / 8);
        for (b = 0; (b < 8) && (i + b < size); b++) {
            if (buf[i + b] != (unsigned char)(v >> (8 * b))) {
                fail(phase, stream, num, "byte %zu of %zu is 0x%02x, "
                     "expected 0x%02x", i + b, size, buf[i + b],
                     (unsigned)(unsigned char)(v >> (8 * b)));
            }
        }
    }
}

static void *xmalloc(size_t size)
{
    void *p = malloc(size);

    if (p == NULL) {
        fprintf(stderr, "mpi_check: rank %d: out of memory (%zu bytes)\n",
                rank, size);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    return p;
}

/* Print the UCX libraries this process has mapped, once each */
static void print_ucx_maps(void)
{
    char  line[4096], seen[64][1024], ns[256] = "?";
    FILE *f = fopen("/proc/self/maps", "r");
    int   nseen = 0, i;
    char *path;
    ssize_t len;

    len = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
    ns[(len > 0) ? len : 1] = '\0';
    printf("mpi_check: rank %d pid %d netns %s\n", rank, (int)getpid(), ns);
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        path = strchr(line, '/');
        if ((path == NULL) || (strstr(path, "/libuc") == NULL)) {
            continue;
        }
        path[strcspn(path, "\n")] = '\0';
        for (i = 0; (i < nseen) && strcmp(seen[i], path); i++) {
        }
        if ((i < nseen) || (nseen == 64) || (strlen(path) >= 1024)) {
            continue;
        }
        strcpy(seen[nseen++], path);
        printf("mpi_check: rank %d maps %s\n", rank, path);
    }
    fclose(f);
    fflush(stdout);
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-n MESSAGES] [-m MAX_SIZE] [-w WINDOW] "
            "[-s SEED] [-c NUM] [-t SECONDS]\n", prog);
}

/* The oldest message of a window not yet completed, or NONE */
static uint64_t oldest(const uint64_t *nums, const MPI_Request *reqs,
                       int window)
{
    uint64_t min = NONE;
    int      slot;

    for (slot = 0; slot < window; slot++) {
        if ((reqs[slot] != MPI_REQUEST_NULL) && (nums[slot] < min)) {
            min = nums[slot];
        }
    }
    return min;
}

int main(int argc, char **argv)
{
    uint64_t       messages = 300, num, next_send, next_recv, done_recv;
    uint64_t       done_send, bytes = 0, total_bytes, max_seen = 0, all_max;
    size_t         max_size = 4u << 20, size;
    int            window = 8, opt, size_world, peer, tag_mod, *tag_ub, flag;
    int            idx, slot, to;
    unsigned char *sbuf, *rbuf, **sbufs, **rbufs;
    uint64_t      *snum, *rnum;
    MPI_Request   *reqs;
    MPI_Status     status;
    double         t0, t1, t2, t, slow_b = 0, slow_nb = 0, last;
    uint64_t       slow_b_num = 0, slow_nb_num = 0;
    size_t         slow_b_size = 0, slow_nb_size = 0;
    const char    *slow_b_op = "-", *slow_nb_op = "-";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size_world);

    while ((opt = getopt(argc, argv, "n:m:w:s:c:t:h")) != -1) {
        switch (opt) {
        case 'n': messages = strtoull(optarg, NULL, 0); break;
        case 'm': max_size = strtoull(optarg, NULL, 0); break;
        case 'w': window = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 0); break;
        case 'c': corrupt = strtoll(optarg, NULL, 0); break;
        case 't': progress.stall_timeout = (unsigned)atoi(optarg); break;
        default:
            if (rank == 0) {
                usage(argv[0]);
            }
            MPI_Finalize();
            return 1;
        }
    }
    if ((size_world != 2) || (window < 1) || (max_size < 1) ||
        (max_size > 0x7fffffff)) {
        if (rank == 0) {
            fprintf(stderr, "mpi_check: needs exactly 2 ranks, WINDOW >= 1, "
                    "1 <= MAX_SIZE < 2 GiB\n");
        }
        MPI_Finalize();
        return 1;
    }
    peer = 1 - rank;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    tag_mod = (flag && (*tag_ub < 32767)) ? *tag_ub + 1 : 32768;
    progress.max_size = max_size;
    if (progress.stall_timeout > 0) {
        signal(SIGALRM, stall_handler);
    }
    signal(SIGTERM, stall_handler);

    /* Phase 1: blocking, one message at a time, random direction */
    sbuf = xmalloc(max_size);
    rbuf = xmalloc(max_size);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    progress.phase       = "blocking";
    progress.send_stream = progress.recv_stream = STREAM_BLOCKING;
    made_progress();
    for (num = 0; num < messages; num++) {
        size = msg_size(STREAM_BLOCKING, num, max_size);
        to = (int)(mix64(msg_key(STREAM_BLOCKING, num)) & 1);
        t = MPI_Wtime();
        if (to == peer) {
            fill(sbuf, STREAM_BLOCKING, num, size);
            progress.send_wait = num;
            MPI_Send(sbuf, (int)size, MPI_BYTE, peer,
                     (int)(num % (uint64_t)tag_mod), MPI_COMM_WORLD);
            progress.send_wait = NONE;
            progress.sent++;
        } else {
            progress.recv_wait = num;
            MPI_Recv(rbuf, (int)max_size, MPI_BYTE, peer, MPI_ANY_TAG,
                     MPI_COMM_WORLD, &status);
            progress.recv_wait = NONE;
            check("blocking", rbuf, &status, STREAM_BLOCKING, num, max_size,
                  tag_mod);
            progress.received++;
            bytes += size;
            max_seen = (size > max_seen) ? size : max_seen;
        }
        t = MPI_Wtime() - t;
        if (t > slow_b) {
            slow_b      = t;
            slow_b_num  = num;
            slow_b_size = size;
            slow_b_op   = (to == peer) ? "send" : "receive";
        }
        made_progress();
    }
    free(sbuf);
    free(rbuf);
    progress.phase = "barrier after the blocking";

    /* Phase 2: non-blocking, both directions at once, <window> sends and
     * <window> receives in flight; reqs[0..window-1] are receives, their
     * message numbers in rnum; reqs[window..] sends, numbers in snum.
     * Rank r sends stream r and receives stream 1-r. */
    MPI_Barrier(MPI_COMM_WORLD);
    t1 = MPI_Wtime();
    sbufs = xmalloc(sizeof(*sbufs) * window);
    rbufs = xmalloc(sizeof(*rbufs) * window);
    snum  = xmalloc(sizeof(*snum) * window);
    rnum  = xmalloc(sizeof(*rnum) * window);
    reqs  = xmalloc(sizeof(*reqs) * 2 * window);
    next_send = next_recv = done_send = done_recv = 0;
    for (slot = 0; slot < window; slot++) {
        sbufs[slot] = xmalloc(max_size);
        rbufs[slot] = xmalloc(max_size);
        reqs[slot] = reqs[window + slot] = MPI_REQUEST_NULL;
    }
    progress.phase       = "non-blocking";
    progress.send_stream = rank;
    progress.recv_stream = peer;
    progress.sent = progress.received = 0;
    made_progress();
    /* Receives are posted in message order, so MPI's non-overtaking rule
     * makes the n-th posted receive take the n-th message of the stream */
    for (slot = 0; (slot < window) && (next_recv < messages); slot++) {
        rnum[slot] = next_recv++;
        MPI_Irecv(rbufs[slot], (int)max_size, MPI_BYTE, peer, MPI_ANY_TAG,
                  MPI_COMM_WORLD, &reqs[slot]);
    }
    for (slot = 0; (slot < window) && (next_send < messages); slot++) {
        snum[slot] = next_send++;
        size = msg_size(rank, snum[slot], max_size);
        fill(sbufs[slot], rank, snum[slot], size);
        MPI_Isend(sbufs[slot], (int)size, MPI_BYTE, peer,
                  (int)(snum[slot] % (uint64_t)tag_mod), MPI_COMM_WORLD,
                  &reqs[window + slot]);
    }
    progress.recv_wait = oldest(rnum, reqs, window);
    progress.send_wait = oldest(snum, reqs + window, window);
    last = MPI_Wtime();
    while ((done_recv < messages) || (done_send < messages)) {
        MPI_Waitany(2 * window, reqs, &idx, &status);
        t = MPI_Wtime();
        if ((idx != MPI_UNDEFINED) && (t - last > slow_nb)) {
            slow_nb      = t - last;
            slow_nb_num  = (idx < window) ? rnum[idx] : snum[idx - window];
            slow_nb_size = msg_size((idx < window) ? peer : rank, slow_nb_num,
                                    max_size);
            slow_nb_op   = (idx < window) ? "receive" : "send";
        }
        last = t;
        if (idx == MPI_UNDEFINED) {
            fprintf(stderr, "mpi_check: rank %d: no request left with %"
                    PRIu64 " received, %" PRIu64 " sent\n", rank, done_recv,
                    done_send);
            MPI_Abort(MPI_COMM_WORLD, 4);
        }
        if (idx < window) {
            slot = idx;
            check("non-blocking", rbufs[slot], &status, peer, rnum[slot],
                  max_size, tag_mod);
            size = msg_size(peer, rnum[slot], max_size);
            bytes += size;
            max_seen = (size > max_seen) ? size : max_seen;
            progress.received = ++done_recv;
            if (next_recv < messages) {
                rnum[slot] = next_recv++;
                MPI_Irecv(rbufs[slot], (int)max_size, MPI_BYTE, peer,
                          MPI_ANY_TAG, MPI_COMM_WORLD, &reqs[slot]);
            }
            progress.recv_wait = oldest(rnum, reqs, window);
        } else {
            slot = idx - window;
            progress.sent = ++done_send;
            if (next_send < messages) {
                snum[slot] = next_send++;
                size = msg_size(rank, snum[slot], max_size);
                fill(sbufs[slot], rank, snum[slot], size);
                MPI_Isend(sbufs[slot], (int)size, MPI_BYTE, peer,
                          (int)(snum[slot] % (uint64_t)tag_mod),
                          MPI_COMM_WORLD, &reqs[window + slot]);
            }
            progress.send_wait = oldest(snum, reqs + window, window);
        }
        made_progress();
    }
    progress.phase = "barrier after the non-blocking";
    MPI_Barrier(MPI_COMM_WORLD);
    t2 = MPI_Wtime();
    alarm(0);
    for (slot = 0; slot < window; slot++) {
        free(sbufs[slot]);
        free(rbufs[slot]);
    }
    free(sbufs);
    free(rbufs);
    free(snum);
    free(rnum);
    free(reqs);

    print_ucx_maps();
    printf("mpi_check: rank %d slowest: blocking %s of message %" PRIu64
           " (%zu bytes) %.1f ms; non-blocking: longest wait %.1f ms, for the "
           "%s of message %" PRIu64 " (%zu bytes)\n", rank, slow_b_op,
           slow_b_num, slow_b_size, slow_b * 1e3, slow_nb * 1e3, slow_nb_op,
           slow_nb_num, slow_nb_size);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);

    MPI_Reduce(&bytes, &total_bytes, 1, MPI_UINT64_T, MPI_SUM, 0,
               MPI_COMM_WORLD);
    MPI_Reduce(&max_seen, &all_max, 1, MPI_UINT64_T, MPI_MAX, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi_check: PASS: seed %" PRIu64 ", %" PRIu64 " blocking + "
               "2x%" PRIu64 " non-blocking messages (window %d), "
               "1..%" PRIu64 " bytes, %.1f MiB checked, "
               "blocking %.2f s, non-blocking %.2f s, total %.2f s\n",
               seed, messages, messages, window, all_max,
               total_bytes / 1048576.0, t1 - t0, t2 - t1, t2 - t0);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
