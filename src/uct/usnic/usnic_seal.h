/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_SEAL_H
#define UCT_USNIC_SEAL_H

#include <ucs/type/status.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>


/*
 * What ends every datagram so that the receiver takes only what the peer
 * sent: nothing, a checksum against damage (XXH3), or with a shared key, a
 * MAC against forgers (keyed BLAKE2b from libsodium). Datagrams are sealed
 * after the provider's prefix; a resent datagram is sealed again, as its
 * trailers may have changed.
 */
typedef enum {
    UCT_USNIC_SEAL_NONE,
    UCT_USNIC_SEAL_CHECKSUM,
    UCT_USNIC_SEAL_MAC
} uct_usnic_seal_type_t;


/* Bytes a seal adds to a datagram */
#define UCT_USNIC_SEAL_CHECKSUM_LEN 4
#define UCT_USNIC_SEAL_MAC_LEN      16  /* a blind guess passes once in 2^128 */
#define UCT_USNIC_SEAL_MAX_LEN      UCT_USNIC_SEAL_MAC_LEN


/* The shared key, derived from the key file's contents */
typedef struct uct_usnic_seal_key {
    uint8_t bytes[32];
} uct_usnic_seal_key_t;


typedef struct uct_usnic_seal uct_usnic_seal_t;


/* XXH3 of a datagram in one or more pieces */
typedef uint64_t (*uct_usnic_seal_checksum_func_t)(const uct_usnic_seal_t *seal,
                                                   const struct iovec *iov,
                                                   unsigned iovcnt);


struct uct_usnic_seal {
    uct_usnic_seal_type_t          type;
    size_t                         length; /* Bytes at the end of a datagram */
    uct_usnic_seal_checksum_func_t checksum;
    struct XXH3_state_s            *hash;  /* For the library's XXH3 */
    void                           *keyed; /* MAC state after the key */
};


/* GCC builds code for AVX2 in a file compiled for any x86-64 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#  define UCT_USNIC_SEAL_HAVE_AVX2 1
#else
#  define UCT_USNIC_SEAL_HAVE_AVX2 0
#endif


static inline size_t uct_usnic_seal_length(uct_usnic_seal_type_t type)
{
    switch (type) {
    case UCT_USNIC_SEAL_CHECKSUM:
        return UCT_USNIC_SEAL_CHECKSUM_LEN;
    case UCT_USNIC_SEAL_MAC:
        return UCT_USNIC_SEAL_MAC_LEN;
    default:
        return 0;
    }
}


/* Read a key file; errors name the variable that gave the path */
ucs_status_t uct_usnic_seal_key_load(const char *var, const char *path,
                                     uct_usnic_seal_key_t *key);


/* Erase a key from memory */
void uct_usnic_seal_key_erase(uct_usnic_seal_key_t *key);


/* key only for UCT_USNIC_SEAL_MAC */
ucs_status_t uct_usnic_seal_init(uct_usnic_seal_t *seal,
                                 uct_usnic_seal_type_t type,
                                 const uct_usnic_seal_key_t *key);


void uct_usnic_seal_cleanup(uct_usnic_seal_t *seal);


/* Write the seal of length bytes of datagram right behind them */
void uct_usnic_seal_put(const uct_usnic_seal_t *seal, void *datagram,
                        size_t length);


/* The same for a datagram in pieces; the seal goes behind the last one */
void uct_usnic_seal_put_iov(const uct_usnic_seal_t *seal,
                            const struct iovec *iov, unsigned iovcnt);


/* Whether a received datagram is what the peer sealed; on success, sets
 * *length_p to the length without the seal */
int uct_usnic_seal_check(const uct_usnic_seal_t *seal, const void *datagram,
                         size_t *length_p);


#if UCT_USNIC_SEAL_HAVE_AVX2
uint64_t uct_usnic_seal_checksum_avx2(const uct_usnic_seal_t *seal,
                                      const struct iovec *iov,
                                      unsigned iovcnt);
#endif


/* Name of a seal type, for logs */
const char *uct_usnic_seal_name(uct_usnic_seal_type_t type);

#endif
