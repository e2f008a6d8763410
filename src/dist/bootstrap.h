/* The bootstrap of a job of several processes: before the processes of a
 * job can build a communicator (ncclCommInitRank), every one of them needs
 * the same opaque id (an ncclUniqueId, 128 bytes) that rank 0 made. This
 * module hands rank 0's bytes to every rank of the job and checks that the
 * ranks agree on the job's shape; nothing of NCCL is used here, so it is
 * tested between plain processes (docs/multi-node.md).
 *
 * Two methods, named by an init string as torch's init_method is:
 *
 *   file:PATH        a file on a file system every rank sees (PATH, and
 *                    small files next to it named PATH.rank<r>)
 *   tcp:HOST:PORT    rank 0 listens on PORT (every interface, IPv4 and
 *                    IPv6), the others connect to HOST:PORT; an IPv6
 *                    address goes in brackets: tcp:[fd00::1]:29500
 *
 * "file://PATH" and "tcp://HOST:PORT" are accepted too.
 *
 * Each call is independent (no global state; calls on several threads at
 * once are fine) and bounded in time: every wait ends at timeout_s after
 * the call began, except that a host name is resolved by the system's
 * resolver under its own time limits. */
#ifndef MT_DIST_BOOTSTRAP_H
#define MT_DIST_BOOTSTRAP_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

/* The largest blob (an ncclUniqueId is 128 bytes) and the most ranks. */
#define MT_BOOTSTRAP_MAX_BLOB 4096
#define MT_BOOTSTRAP_MAX_RANKS 65536

/* Rank 0 sends len bytes at blob; every other rank receives them into its
 * blob, which must be len bytes too (len 0: a pure barrier; blob may then
 * be NULL). Returns on rank 0 only once every other rank has the bytes, and
 * on the others once they have them, so rank 0's caller may go on to
 * ncclCommInitRank knowing that every rank can too. A rank's blob is
 * written only on success.
 *
 * Fails with a message naming the problem: MT_ERR_INVALID_ARGUMENT for a
 * malformed init string, a rank outside [0, n_ranks), a len above
 * MT_BOOTSTRAP_MAX_BLOB, or ranks that disagree on n_ranks or len (found by
 * rank 0 and passed on to the ranks it knows); MT_ERR_IO for a timeout
 * (naming the ranks that did not join, where it is known), a port in use, a
 * host that cannot be reached, a directory that does not exist, a peer that
 * closes early or sends what is not this protocol. When rank 0 fails, the
 * ranks that had joined fail too, with rank 0's message and status. */
mt_status mt_bootstrap_share(mt_err err, const char *init, int rank, int n_ranks, void *blob, size_t len,
                             double timeout_s);

/* Checks the syntax of an init string, without touching a file or the
 * network: to refuse a bad one before any expensive setup. */
mt_status mt_bootstrap_check_init(mt_err err, const char *init);

/* The formats below are shared between the processes of a job, which may run
 * different builds of the library: a change that breaks them changes the
 * version, and a peer of another version is refused by name. Integers are
 * little-endian.
 *
 * TCP: every message is a 32-byte header of eight u32, then a payload:
 *   magic, version, kind, rank, n_ranks, blob_len, status, payload_len
 * rank > 0 -> rank 0: HELLO (no payload); rank 0 -> rank: BLOB (the blob)
 * or ERROR (status: an mt_status; payload: a message of at most
 * MT_BOOTSTRAP_MSG_MAX bytes); rank -> rank 0: ACK once it holds the blob.
 *
 * File: a 64-byte header, then the payload:
 *   0  magic (8 bytes)      8 version     12 kind     16 rank of the writer
 *  20  n_ranks             24 blob_len    28 payload_len
 *  32  nonce (16 bytes): random, made by rank 0 for this job
 *  48  status (ABORTED)    52 zero        56 FNV-1a 64 of bytes 0..55 and
 *                                            the payload (u64)
 * Rank 0 writes PATH as PUBLISHED (payload: the blob); rank r writes
 * PATH.rank<r> as ACK of the nonce it read; once every rank acknowledged
 * rank 0 rewrites PATH as RELEASED; each rank then removes its file and
 * returns, and rank 0 removes PATH once they all have. A failing rank 0
 * rewrites PATH as ABORTED (payload: its message); a rank that gives up
 * after acknowledging rewrites its own file so, and rank 0 stops the job.
 * Every file is written to NAME.tmp and renamed into place, so a reader
 * never sees half a file. */
#define MT_BOOTSTRAP_VERSION 1u
#define MT_BOOTSTRAP_TCP_MAGIC 0x7442544du /* "MTBt" */
#define MT_BOOTSTRAP_TCP_HEADER 32
#define MT_BOOTSTRAP_FILE_MAGIC "MTBOOTF\n"
#define MT_BOOTSTRAP_FILE_HEADER 64
#define MT_BOOTSTRAP_MSG_MAX 1024

enum {
    MT_BOOTSTRAP_HELLO = 1,
    MT_BOOTSTRAP_BLOB = 2,
    MT_BOOTSTRAP_ERROR = 3,
    MT_BOOTSTRAP_ACK = 4,
    MT_BOOTSTRAP_PUBLISHED = 5,
    MT_BOOTSTRAP_RELEASED = 6,
    MT_BOOTSTRAP_ABORTED = 7,
};

#endif
