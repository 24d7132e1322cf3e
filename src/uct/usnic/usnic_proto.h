/**
 * Copyright (c) uct_usnic contributors. ALL RIGHTS RESERVED.
 *
 * See file LICENSE for terms.
 */

#ifndef UCT_USNIC_PROTO_H
#define UCT_USNIC_PROTO_H

#include <ucs/sys/compiler_def.h>
#include <ucs/sys/math.h>

#include <stdint.h>


/*
 * Wire format of the reliable protocol; docs/protocol.md explains it.
 * All fields are little-endian, except addresses and ports (network order).
 */

#define UCT_USNIC_PROTO_VERSION 6

/* Stream id of a packet whose sender does not know the receiver's stream
 * yet: the packet carries an open extension instead */
#define UCT_USNIC_STREAM_ID_NONE UINT32_MAX


typedef uint32_t uct_usnic_psn_t;


/* Wraparound-safe comparison of packet sequence numbers */
#define UCT_USNIC_PSN_LT(_a, _b) UCS_CIRCULAR_COMPARE32(_a, <, _b)
#define UCT_USNIC_PSN_LE(_a, _b) UCS_CIRCULAR_COMPARE32(_a, <=, _b)
#define UCT_USNIC_PSN_GT(_a, _b) UCS_CIRCULAR_COMPARE32(_a, >, _b)
#define UCT_USNIC_PSN_GE(_a, _b) UCS_CIRCULAR_COMPARE32(_a, >=, _b)


typedef enum {
    UCT_USNIC_PKT_AM    = 1, /* Active message (fragment), data channel */
    UCT_USNIC_PKT_ACK   = 2, /* Acknowledgement, priority channel */
    UCT_USNIC_PKT_PUT   = 3, /* Remote write (fragment), data channel */
    UCT_USNIC_PKT_PROBE = 4, /* Asks for an ACK (ep_check), data channel */
    UCT_USNIC_PKT_GET   = 5, /* Remote read request, data channel */
    UCT_USNIC_PKT_GET_REPLY = 6, /* Data of a remote read (fragment), data
                                    channel */
    UCT_USNIC_PKT_BUNDLE = 7, /* Several short AMs, data channel */
    UCT_USNIC_PKT_LAST
} uct_usnic_pkt_type_t;


enum {
    UCT_USNIC_PKT_FLAG_FIRST = UCS_BIT(0), /* First fragment of a message */
    UCT_USNIC_PKT_FLAG_LAST  = UCS_BIT(1), /* Last fragment of a message */
    UCT_USNIC_PKT_FLAG_OPEN  = UCS_BIT(2), /* Open trailer at the end */
    UCT_USNIC_PKT_FLAG_ACK   = UCS_BIT(3), /* ACK trailer after the payload */
    UCT_USNIC_PKT_FLAG_ACK_REQ = UCS_BIT(4), /* The sender's window is full:
                                                ACK without delay */
    UCT_USNIC_PKT_FLAG_PADDED  = UCS_BIT(5), /* The body ends with padding,
                                                whose last byte is its length */
    UCT_USNIC_PKT_FLAGS_ALL  = UCS_MASK(6)
};


/* Flags of one stream's ACK in a standalone ACK */
enum {
    /* The acknowledged ep probed (ep_check) an iface that has closed every
     * ep it had to the prober's iface: the connection is gone */
    UCT_USNIC_ACK_FLAG_CLOSED = UCS_BIT(0),
    UCT_USNIC_ACK_FLAGS_ALL   = UCS_MASK(1)
};


/**
 * Header of every datagram (24 bytes).
 */
typedef struct uct_usnic_hdr {
    uint8_t  version;     /* UCT_USNIC_PROTO_VERSION */
    uint8_t  type;        /* uct_usnic_pkt_type_t */
    uint8_t  flags;       /* UCT_USNIC_PKT_FLAG_xx, ACK: 0 */
    uint8_t  am_id;       /* AM id of an AM packet, else 0 */
    uint32_t incarnation; /* Receiving iface's incarnation */
    uint32_t stream_id;   /* AM, PUT: receiver's stream; ACK: 0 */
    uint32_t psn;         /* AM, PUT: sequence number; ACK: 0 */
    uint64_t token;       /* AM, PUT: the stream's secret; ACK: 0 */
} UCS_S_PACKED uct_usnic_hdr_t;


/**
 * Open trailer: who sends, so the receiver can create its stream and send
 * ACKs back. Carried at the end of data packets (so the payload offset stays
 * fixed) until the first ACK tells the sender the receiver's stream id. The
 * stream's token is the header's. Opening a stream takes the receiver's
 * incarnation and open key, 64 random bits given only with its address.
 */
typedef struct uct_usnic_open_ext {
    uint32_t src_incarnation; /* Sending iface */
    uint32_t src_ep_id;       /* Sending ep: ACKs are addressed to it */
    uint32_t src_ep_serial;   /* Tells apart eps that reuse an id */
    uint32_t src_in_addr;     /* Sending iface's IPv4 address */
    uint16_t src_prio_port;   /* Where ACKs go */
    uint16_t src_data_port;
    uint32_t first_psn;       /* Random, so that nobody can guess the next */
    uint32_t src_open_key;    /* Sending iface's, for streams back to it */
    uint32_t dst_open_key;    /* Receiving iface's, from its address */
} UCS_S_PACKED uct_usnic_open_ext_t;


/**
 * Start of the body of every PUT packet: where the whole remote write goes
 * and the key that grants it, so that each datagram is checked on its own
 * against the complete range before any byte of the write is applied.
 */
typedef struct uct_usnic_put_ext {
    uint64_t secret;  /* Of the target's registration */
    uint64_t address; /* Target address of the whole write */
    uint32_t rkey_id; /* Target's registration */
    uint32_t length;  /* Of the whole write */
    uint32_t offset;  /* Of this datagram's data within the write */
} UCS_S_PACKED uct_usnic_put_ext_t;


/**
 * Body of a GET packet: what to read and the key that grants it. The target
 * answers on its own stream to the requester's iface.
 */
typedef struct uct_usnic_get_ext {
    uint64_t secret;  /* Of the target's registration */
    uint64_t address; /* Target address of the read */
    uint32_t rkey_id; /* Target's registration */
    uint32_t length;  /* Bytes to read */
    uint32_t get_id;  /* Requester's read, echoed in the reply */
    uint32_t get_serial; /* Tells apart reads that reuse an id */
} UCS_S_PACKED uct_usnic_get_ext_t;


/* Status of a GET_REPLY */
enum {
    UCT_USNIC_GET_REPLY_OK      = 0,
    UCT_USNIC_GET_REPLY_REFUSED = 1  /* Key or range check failed: no data */
};


/**
 * Start of the body of every GET_REPLY packet; the read data follows.
 */
typedef struct uct_usnic_get_reply_ext {
    uint32_t get_id;  /* From the request */
    uint32_t get_serial;
    uint32_t offset;  /* Of this datagram's data within the read */
    uint32_t status;  /* UCT_USNIC_GET_REPLY_xx */
} UCS_S_PACKED uct_usnic_get_reply_ext_t;


/**
 * Each AM of a BUNDLE packet's body starts with this; its data follows.
 */
typedef struct uct_usnic_bundle_rec {
    uint8_t  am_id;
    uint8_t  reserved; /* 0 */
    uint16_t length;   /* Of the data */
} UCS_S_PACKED uct_usnic_bundle_rec_t;


/**
 * What an ACK says, the same whether it rides on an AM packet of the reverse
 * direction (ACK trailer, after the payload and before any open trailer) or
 * travels standalone.
 */
typedef struct uct_usnic_ack_ext {
    uint32_t ep_id;     /* Acknowledged ep at the receiver of the packet */
    uint32_t stream_id; /* Acknowledging stream: the ep sends to it */
    uint32_t psn;       /* Cumulative ACK */
    uint64_t token;     /* The acknowledged ep's, from its packets: only the
                           receiver of those can know it */
} UCS_S_PACKED uct_usnic_ack_ext_t;


/* Datagrams past the first hole a selective ACK can report */
#define UCT_USNIC_SACK_RANGE 64


/**
 * Start of the body of a standalone ACK; one record per acknowledged stream
 * follows. The records of one datagram are for eps of the iface it goes to,
 * from streams of the iface that sends it: one datagram, not one per
 * stream, answers a peer that sends on many eps at once.
 */
typedef struct uct_usnic_ack_body {
    uint32_t src_incarnation; /* Acknowledging iface */
} UCS_S_PACKED uct_usnic_ack_body_t;


/**
 * One stream's ACK in a standalone ACK. A piggy-backed ACK needs none of
 * the fields after the first: it never reports holes nor closed peers.
 */
typedef struct uct_usnic_ack_rec {
    uct_usnic_ack_ext_t ack;
    uint32_t            flags; /* UCT_USNIC_ACK_FLAG_xx */
    uint64_t            sack;  /* Bit i: psn + 2 + i arrived */
} UCS_S_PACKED uct_usnic_ack_rec_t;


/* Most records in one standalone ACK (1,052 bytes) */
#define UCT_USNIC_ACK_MAX_RECS 32


/* The largest standalone ACK */
typedef struct uct_usnic_ack_packet {
    uct_usnic_hdr_t      hdr;
    uct_usnic_ack_body_t body;
    uct_usnic_ack_rec_t  recs[UCT_USNIC_ACK_MAX_RECS];
} UCS_S_PACKED uct_usnic_ack_packet_t;

#endif
