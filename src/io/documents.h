/* The document file's layout (MT_TOKENS_DOCS, docs/data.md), shared by its
 * reader (data.c) and its writer (documents.c), so the two cannot disagree:
 * a 64-byte header, the tokens (padded to 8 bytes), the end of each
 * document, and a bit per token that says whether it is a target of the
 * loss. */
#ifndef MT_IO_DOCUMENTS_H
#define MT_IO_DOCUMENTS_H

#define DOCS_MAGIC "MTTOKENS"
#define DOCS_VERSION 1u
#define DOCS_HEADER_BYTES 64u
#define DOCS_HAS_MASK 1u
/* Counts at or above 2^56 are refused: sizes then fit 64 bits with room to spare. */
#define DOCS_MAX_COUNT ((uint64_t)1 << 56)

#endif
