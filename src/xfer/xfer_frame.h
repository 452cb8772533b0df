/*
 * xfer_frame.h - the transfer engine's wire frames: encode and decode.
 *
 * Pure functions (no I/O, no allocation, no globals) so that they can be
 * unit-tested and fuzzed on their own.  Every frame starts with a fixed
 * 40-byte header, little-endian:
 *
 *   off  size  field
 *     0     4  magic   "KVTF" (0x4654564b read as little-endian u32)
 *     4     1  type    enum kvt__ftype
 *     5     1  flags   0 (reserved)
 *     6     2  rsvd    0 (reserved; non-zero is refused)
 *     8     4  len     payload bytes that follow the header
 *    12     4  status  0, or an errno / WC status (NACK, DONE_ACK, ERROR)
 *    16     8  seq     write sequence number (WRITE, ACK, NACK), writes in
 *                      the room (DONE)
 *    24     8  room    bootstrap room id
 *    32     8  addr    destination address (WRITE), bytes in the room
 *                      (DONE), writes acknowledged (ACK)
 *
 * The protocol version travels in the HELLO payload's first 4 bytes, so a
 * future layout can still be told apart and refused with a clear message.
 * docs/transfer.md describes the exchange.
 */
#ifndef KVC_XFER_FRAME_H
#define KVC_XFER_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define KVT_FRAME_MAGIC 0x4654564bu
#define KVT_HDR_LEN 40u
/* Largest payload of a frame other than WRITE (HELLO, NACK, ERROR...);
 * CMA_WRITE's is KVT_CMA_CTL_MAX. */
#define KVT_CTL_MAX 4096u
/* Longest session_id / token carried in a HELLO. */
#define KVT_HELLO_STR_MAX 255u

enum kvt__ftype {
    KVT_F_HELLO = 1,      /* client -> server: version, generation, session_id, token */
    KVT_F_HELLO_OK = 2,   /* server -> client: same payload, the server's values */
    KVT_F_WRITE = 3,      /* client -> server: len bytes for addr, room, seq */
    KVT_F_ACK = 4,        /* server -> client: writes up to seq applied (addr = count) */
    KVT_F_NACK = 5,       /* server -> client: write seq refused; payload: reason;
                             addr KVT_NACK_SOCKET: not refused, send it again
                             through the socket (same-host copy fell back) */
    KVT_F_DONE = 6,       /* client -> server: room ends: seq writes, addr bytes */
    KVT_F_DONE_ACK = 7,   /* server -> client: room tally checked (status 0 = ok) */
    KVT_F_ABORT = 8,      /* client -> server: room aborted; payload: reason */
    KVT_F_ERROR = 9,      /* either way: fatal for the connection; payload: reason */
    KVT_F_QP_INFO = 10,   /* verbs: either way, once: this side's RC QP record
                           (xfer_verbs_rules.h); the server answers with its own */
    KVT_F_READ = 11,      /* client -> server: read request; payload: 1..256
                             entries (kvt__read_ent), seq = the request's number,
                             addr = the bytes asked for in all */
    KVT_F_READ_DATA = 12, /* server -> client: the answer to READ seq: len bytes,
                             the entries' data back to back (addr = entries) */
    KVT_F_READ_NACK = 13, /* server -> client: READ seq refused, nothing of it
                             sent; status errno, payload: reason */
    KVT_F_DESC_REQ = 14,  /* client -> server instead of HELLO: send me your
                             descriptor; payload: a HELLO payload (version, token) */
    KVT_F_DESC = 15,      /* server -> client: the descriptor's JSON text
                             (payload up to KVT_DESC_MAX), then the server closes */
    KVT_F_WRITEV = 16,    /* client -> server: a write of several runs: payload
                             1..256 entries (kvt__read_ent: destination, length),
                             then addr more bytes, the runs' data back to back;
                             seq, ACK and NACK as a WRITE's */
    /* The same-host copy (xfer_cma.h), only after both HELLOs carried
     * KVT_HELLO_F_CMA: */
    KVT_F_CMA_HELLO = 17,   /* either way, once: payload a kvt__cma_id (status 0),
                                or (server, status errno) the reason it is off */
    KVT_F_CMA_CHECK = 18,   /* client -> server: my slot holds your nonce;
                                server -> client: status 0 (copies on), or errno
                                and the reason */
    KVT_F_CMA_WRITE = 19,   /* client -> server: a write the server copies from
                                the client: payload 1..256 entries (kvt__read_ent:
                                destination, length) then as many u64 source
                                addresses; addr = the bytes in all; seq, ACK and
                                NACK as a WRITE's; no data follows */
    KVT_F_CMA_READ = 20,    /* client -> server: a READ's payload; answered by
                                CMA_READ_GO (or READ_NACK), no data */
    KVT_F_CMA_READ_GO = 21, /* server -> client: read seq's runs are checked and
                                pinned: copy them (addr = bytes) */
    KVT_F_CMA_READ_END = 22 /* client -> server: read seq copied (or given up):
                                unpin its runs */
};

/* A NACK's addr: the write was not refused but its same-host copy failed
 * for a reason of the receiver's host (a permission, the pid check): the
 * sender sends it again as a socket frame, and sends that connection's
 * data through the socket from then on (xfer_cma.h).  An older sender,
 * which ignores addr, fails the room as for any NACK. */
#define KVT_NACK_SOCKET 1u
/* The highest frame type a decoder accepts. */
#define KVT_F_MAX KVT_F_CMA_READ_END

/* HELLO flags (the u32 after the version; 0 from engines before them,
 * ignored by their decoders). */
#define KVT_HELLO_F_CMA 1u /* this engine offers the same-host copy */

/* A CMA_WRITE's payload: KVT_CMA_ENT_LEN bytes per run (a 16-byte
 * kvt__read_ent, then the run's u64 source address, tables one after the
 * other), up to KVT_READ_ENTS_MAX runs. */
#define KVT_CMA_ENT_LEN 24u
#define KVT_CMA_CTL_MAX (KVT_READ_ENTS_MAX * KVT_CMA_ENT_LEN)

/* Largest payload of a DESC frame (= transfer.h's KVT_DESC_MAX). */
#define KVT_DESC_FRAME_MAX (1u << 20)

/* One entry of a READ request (16 bytes, little-endian): u64 address in
 * the server's registered memory, u64 length (1..KVT_FRAME_MAX). */
#define KVT_READ_ENT_LEN 16u
#define KVT_READ_ENTS_MAX (KVT_CTL_MAX / KVT_READ_ENT_LEN) /* 256 */
typedef struct kvt__read_ent {
    uint64_t addr, len;
} kvt__read_ent;

/* Decode a READ payload of len bytes into ent (KVT_READ_ENTS_MAX slots).
 * Returns the entry count, or -1 with a reason in err: empty, not a
 * multiple of 16 bytes, an entry of length 0 or above max_len, an entry
 * that wraps around, or a total above max_total (*total: the sum). */
int kvt__read_decode(const uint8_t *buf, size_t len, uint64_t max_len, uint64_t max_total,
                     kvt__read_ent *ent, uint64_t *total, char *err, size_t cap);

typedef struct kvt__frame {
    uint8_t type;
    uint8_t flags;
    uint32_t len;
    int32_t status;
    uint64_t seq;
    uint64_t room;
    uint64_t addr;
} kvt__frame;

/* Name of a frame type ("WRITE", ...; "type N" for unknown: uses buf). */
const char *kvt__ftype_name(uint8_t type);

/* Write f as a 40-byte header into out. */
void kvt__frame_encode(const kvt__frame *f, uint8_t out[KVT_HDR_LEN]);

/* Decode a 40-byte header.  Returns 0, or -1 with a reason in err (cap
 * bytes): bad magic, reserved bits set, unknown type, payload longer than
 * KVT_CTL_MAX for a control frame, than max_write for a WRITE or a
 * READ_DATA, than KVT_DESC_FRAME_MAX for a DESC. */
int kvt__frame_decode(const uint8_t in[KVT_HDR_LEN], uint32_t max_write, kvt__frame *f, char *err,
                      size_t cap);

/* HELLO / HELLO_OK payload:
 *   u32 version, u32 flags (KVT_HELLO_F_*), u64 generation,
 *   u16 session_id length, session_id bytes, u16 token length, token bytes */
typedef struct kvt__hello {
    uint32_t version;
    uint32_t flags; /* KVT_HELLO_F_* */
    uint64_t generation;
    char session_id[KVT_HELLO_STR_MAX + 1];
    char token[KVT_HELLO_STR_MAX + 1];
} kvt__hello;

/* Encode h into buf (cap bytes).  Returns the length, or 0 if it does not
 * fit or a string is longer than KVT_HELLO_STR_MAX. */
size_t kvt__hello_encode(const kvt__hello *h, uint8_t *buf, size_t cap);

/* Decode a HELLO payload of len bytes.  Returns 0; -1 with a reason in err
 * when malformed.  h->version is filled whenever len >= 4, even on error,
 * so a version mismatch can be reported as such. */
int kvt__hello_decode(const uint8_t *buf, size_t len, kvt__hello *h, char *err, size_t cap);

/* Constant-time equality of two handshake tokens, each a NUL-terminated
 * string zero-padded to KVT_HELLO_STR_MAX + 1 bytes (as kvt__hello_decode
 * leaves h->token).  Every one of the 256 bytes is compared, whatever the
 * tokens' contents and lengths, so the time taken reveals neither (a
 * shorter token differs in its padding).  Returns 1 when equal. */
int kvt__token_equal(const char want[KVT_HELLO_STR_MAX + 1], const char got[KVT_HELLO_STR_MAX + 1]);

/* Little-endian helpers. */
static inline void kvt__put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvt__put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t kvt__get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t kvt__get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#endif
