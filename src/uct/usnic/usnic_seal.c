/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "usnic_seal.h"

#include <ucs/debug/log.h>
#include <ucs/debug/memtrack_int.h>
#include <ucs/sys/math.h>
#include <ucs/sys/sys.h>
#include <ucs/arch/cpu.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#if HAVE_USNIC_SODIUM
#  include <sodium.h>
#endif


/* Shorter secrets are guessable; a key file holds random bytes, usually 32 */
#define UCT_USNIC_SEAL_KEY_MIN      16
#define UCT_USNIC_SEAL_KEY_MAX      4096


const char *uct_usnic_seal_name(uct_usnic_seal_type_t type)
{
    switch (type) {
    case UCT_USNIC_SEAL_CHECKSUM:
        return "checksum";
    case UCT_USNIC_SEAL_MAC:
        return "MAC";
    default:
        return "none";
    }
}

#if HAVE_USNIC_SODIUM

static ucs_status_t uct_usnic_seal_key_read(const char *var, const char *path,
                                            uint8_t *buf, size_t *length_p)
{
    ucs_status_t status = UCS_ERR_INVALID_PARAM;
    struct stat st;
    ssize_t ret;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ucs_error("%s=%s: cannot open the key file: %m", var, path);
        return UCS_ERR_INVALID_PARAM;
    }

    if (fstat(fd, &st) != 0) {
        ucs_error("%s=%s: stat failed: %m", var, path);
        goto out;
    }

    if (!S_ISREG(st.st_mode)) {
        ucs_error("%s=%s: not a regular file", var, path);
        goto out;
    }

    if ((st.st_size < UCT_USNIC_SEAL_KEY_MIN) ||
        (st.st_size > UCT_USNIC_SEAL_KEY_MAX)) {
        ucs_error("%s=%s: the key file has %lld bytes; it must have %d to %d "
                  "(e.g. head -c 32 /dev/urandom > %s)", var, path,
                  (long long)st.st_size, UCT_USNIC_SEAL_KEY_MIN,
                  UCT_USNIC_SEAL_KEY_MAX, path);
        goto out;
    }

    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        ucs_warn("%s=%s: the key file is accessible to others than its "
                 "owner (mode %04o): whoever can read it can forge datagrams",
                 var, path, (unsigned)(st.st_mode & 07777));
    }

    ret = read(fd, buf, st.st_size);
    if (ret != st.st_size) {
        ucs_error("%s=%s: reading the key file failed: %s", var, path,
                  (ret < 0) ? strerror(errno) : "short read");
        goto out;
    }

    *length_p = ret;
    status    = UCS_OK;
out:
    close(fd);
    return status;
}

ucs_status_t uct_usnic_seal_key_load(const char *var, const char *path,
                                     uct_usnic_seal_key_t *key)
{
    uint8_t buf[UCT_USNIC_SEAL_KEY_MAX];
    ucs_status_t status;
    size_t length;

    if (sodium_init() < 0) {
        ucs_error("%s: libsodium failed to initialize", var);
        return UCS_ERR_NO_DEVICE;
    }

    status = uct_usnic_seal_key_read(var, path, buf, &length);
    if (status == UCS_OK) {
        /* Any length of secret gives a key of the size BLAKE2b wants */
        crypto_generichash(key->bytes, sizeof(key->bytes), buf, length, NULL,
                           0);
    }

    sodium_memzero(buf, sizeof(buf));
    return status;
}

void uct_usnic_seal_key_erase(uct_usnic_seal_key_t *key)
{
    sodium_memzero(key, sizeof(*key));
}

static ucs_status_t uct_usnic_seal_mac_init(uct_usnic_seal_t *seal,
                                            const uct_usnic_seal_key_t *key)
{
    crypto_generichash_state *keyed;
    int ret;

    /* Its type asks for more alignment than malloc gives */
    ret = ucs_posix_memalign((void**)&keyed, UCS_SYS_CACHE_LINE_SIZE,
                             sizeof(*keyed), "usnic_seal_mac");
    if (ret != 0) {
        ucs_error("failed to allocate the MAC state");
        return UCS_ERR_NO_MEMORY;
    }

    /* Every datagram's MAC starts from this state: the key is hashed once */
    crypto_generichash_init(keyed, key->bytes, sizeof(key->bytes),
                            UCT_USNIC_SEAL_MAC_LEN);
    seal->keyed = keyed;
    return UCS_OK;
}

static void uct_usnic_seal_mac_cleanup(uct_usnic_seal_t *seal)
{
    sodium_memzero(seal->keyed, sizeof(crypto_generichash_state));
    ucs_free(seal->keyed);
}

static void uct_usnic_seal_mac(const uct_usnic_seal_t *seal,
                               const struct iovec *iov, unsigned iovcnt,
                               uint8_t *mac)
{
    crypto_generichash_state state;
    unsigned i;

    memcpy(&state, seal->keyed, sizeof(state));
    for (i = 0; i < iovcnt; ++i) {
        crypto_generichash_update(&state, iov[i].iov_base, iov[i].iov_len);
    }
    crypto_generichash_final(&state, mac, UCT_USNIC_SEAL_MAC_LEN);
}

static int uct_usnic_seal_mac_equal(const uint8_t *a, const uint8_t *b)
{
    return crypto_verify_16(a, b) == 0;
}

#else

ucs_status_t uct_usnic_seal_key_load(const char *var, const char *path,
                                     uct_usnic_seal_key_t *key)
{
    ucs_error("%s=%s: this build of the usnic transport has no libsodium, "
              "which the MAC needs: install libsodium-dev and rebuild UCX",
              var, path);
    return UCS_ERR_UNSUPPORTED;
}

void uct_usnic_seal_key_erase(uct_usnic_seal_key_t *key)
{
}

static ucs_status_t uct_usnic_seal_mac_init(uct_usnic_seal_t *seal,
                                            const uct_usnic_seal_key_t *key)
{
    return UCS_ERR_UNSUPPORTED;
}

static void uct_usnic_seal_mac_cleanup(uct_usnic_seal_t *seal)
{
}

static void uct_usnic_seal_mac(const uct_usnic_seal_t *seal,
                               const struct iovec *iov, unsigned iovcnt,
                               uint8_t *mac)
{
    ucs_fatal("no MAC without libsodium");
}

static int uct_usnic_seal_mac_equal(const uint8_t *a, const uint8_t *b)
{
    return 0;
}

#endif

/* XXH3 by the library, for CPUs without AVX2 */
static uint64_t uct_usnic_seal_checksum_generic(const uct_usnic_seal_t *seal,
                                                const struct iovec *iov,
                                                unsigned iovcnt)
{
    unsigned i;

    if (iovcnt == 1) {
        return XXH3_64bits(iov[0].iov_base, iov[0].iov_len);
    }

    XXH3_64bits_reset(seal->hash);
    for (i = 0; i < iovcnt; ++i) {
        XXH3_64bits_update(seal->hash, iov[i].iov_base, iov[i].iov_len);
    }
    return XXH3_64bits_digest(seal->hash);
}

static uct_usnic_seal_checksum_func_t uct_usnic_seal_checksum_func(void)
{
#if UCT_USNIC_SEAL_HAVE_AVX2
    /* Not ucs_arch_get_cpu_flag(): UCX 1.13 reads CPUID leaf 7 without
     * clearing the subleaf and misses AVX2 on some CPUs */
    if (__builtin_cpu_supports("avx2")) {
        return uct_usnic_seal_checksum_avx2;
    }
#endif
    return uct_usnic_seal_checksum_generic;
}

ucs_status_t uct_usnic_seal_init(uct_usnic_seal_t *seal,
                                 uct_usnic_seal_type_t type,
                                 const uct_usnic_seal_key_t *key)
{
    seal->type     = type;
    seal->length   = uct_usnic_seal_length(type);
    seal->checksum = NULL;
    seal->hash     = NULL;
    seal->keyed    = NULL;

    switch (type) {
    case UCT_USNIC_SEAL_CHECKSUM:
        seal->checksum = uct_usnic_seal_checksum_func();
        seal->hash     = XXH3_createState();
        if (seal->hash == NULL) {
            ucs_error("failed to allocate the checksum state");
            return UCS_ERR_NO_MEMORY;
        }
        return UCS_OK;
    case UCT_USNIC_SEAL_MAC:
        return uct_usnic_seal_mac_init(seal, key);
    default:
        return UCS_OK;
    }
}

void uct_usnic_seal_cleanup(uct_usnic_seal_t *seal)
{
    if (seal->hash != NULL) {
        XXH3_freeState(seal->hash);
    }
    if (seal->keyed != NULL) {
        uct_usnic_seal_mac_cleanup(seal);
    }
}

/* The checksum is copied and compared with its constant size: the compiler
 * does that in place, where a call to the library cost as much as the hash
 * of a short datagram */
void uct_usnic_seal_put_iov(const uct_usnic_seal_t *seal,
                            const struct iovec *iov, unsigned iovcnt)
{
    const struct iovec *last = &iov[iovcnt - 1];
    void *seal_p             = UCS_PTR_BYTE_OFFSET(last->iov_base,
                                                   last->iov_len);
    uint32_t checksum;

    if (seal->type == UCT_USNIC_SEAL_CHECKSUM) {
        checksum = seal->checksum(seal, iov, iovcnt);
        memcpy(seal_p, &checksum, sizeof(checksum));
    } else {
        uct_usnic_seal_mac(seal, iov, iovcnt, seal_p);
    }
}

void uct_usnic_seal_put(const uct_usnic_seal_t *seal, void *datagram,
                        size_t length)
{
    struct iovec iov = {.iov_base = datagram, .iov_len = length};

    uct_usnic_seal_put_iov(seal, &iov, 1);
}

int uct_usnic_seal_check(const uct_usnic_seal_t *seal, const void *datagram,
                         size_t *length_p)
{
    uint8_t mac[UCT_USNIC_SEAL_MAC_LEN];
    struct iovec iov;
    const void *seal_p;
    uint32_t checksum;

    if (*length_p < seal->length) {
        return 0;
    }

    iov.iov_base = (void*)datagram;
    iov.iov_len  = *length_p - seal->length;
    seal_p       = UCS_PTR_BYTE_OFFSET(datagram, iov.iov_len);
    if (seal->type == UCT_USNIC_SEAL_CHECKSUM) {
        checksum = seal->checksum(seal, &iov, 1);
        if (memcmp(&checksum, seal_p, sizeof(checksum)) != 0) {
            return 0;
        }
    } else {
        uct_usnic_seal_mac(seal, &iov, 1, mac);
        if (!uct_usnic_seal_mac_equal(mac, seal_p)) {
            return 0;
        }
    }

    *length_p = iov.iov_len;
    return 1;
}
