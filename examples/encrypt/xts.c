// SPDX-License-Identifier: MIT
/*
 * xts.c - AES-XTS from AES-ECB, many data units per call (xts.h).
 *
 * For block j of a data unit whose encrypted tweak is T:
 *	T_j = T * alpha^j			in GF(2^128)
 *	C_j = AES-ECB(key 1, P_j ^ T_j) ^ T_j
 * and the other way round with AES decryption.  Blocks and tweaks are
 * little-endian 128-bit numbers (IEEE 1619): multiplying by alpha shifts
 * left by one and folds the bit shifted out back in as 0x87.
 */
#include <endian.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <stdlib.h>
#include <string.h>

#include "xts.h"

#define CHUNK		(128U << 10)		/* data bytes per ECB call */
#define CHUNK_BLOCKS	(CHUNK / 16)
#define MIN_UNIT	512U
#define CHUNK_UNITS	(CHUNK / MIN_UNIT)	/* the most a chunk holds */

static EVP_CIPHER_CTX *ecb(const EVP_CIPHER *cipher,
			   const unsigned char *key, int enc)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();

	if (!ctx)
		return NULL;
	if (!EVP_CipherInit_ex2(ctx, cipher, key, NULL, enc, NULL) ||
	    !EVP_CIPHER_CTX_set_padding(ctx, 0)) {
		EVP_CIPHER_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

int xts_init(struct xts *x, const unsigned char *key, size_t key_len)
{
	const EVP_CIPHER *cipher;
	size_t half = key_len / 2;

	memset(x, 0, sizeof(*x));
	if (key_len == 32)
		cipher = EVP_aes_128_ecb();
	else if (key_len == 64)
		cipher = EVP_aes_256_ecb();
	else
		return -EINVAL;
	x->data_enc = ecb(cipher, key, 1);
	x->data_dec = ecb(cipher, key, 0);
	x->tweak = ecb(cipher, key + half, 1);
	x->tweaks = aligned_alloc(64, CHUNK_BLOCKS * 16);
	x->ivs = aligned_alloc(64, CHUNK_UNITS * 16);
	if (!x->data_enc || !x->data_dec || !x->tweak || !x->tweaks ||
	    !x->ivs) {
		xts_fini(x);
		return -ENOMEM;
	}
	return 0;
}

void xts_fini(struct xts *x)
{
	/* EVP_CIPHER_CTX_free() wipes the key schedules */
	EVP_CIPHER_CTX_free(x->data_enc);
	EVP_CIPHER_CTX_free(x->data_dec);
	EVP_CIPHER_CTX_free(x->tweak);
	if (x->tweaks)
		OPENSSL_cleanse(x->tweaks, CHUNK_BLOCKS * 16);
	if (x->ivs)
		OPENSSL_cleanse(x->ivs, CHUNK_UNITS * 16);
	free(x->tweaks);
	free(x->ivs);
	memset(x, 0, sizeof(*x));
}

static inline uint64_t load64(const unsigned char *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return le64toh(v);
}

static inline void store64(unsigned char *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, sizeof(v));
}

/* One chunk: nunits whole units of unit bytes, the first at byte off. */
static int chunk(struct xts *x, bool enc, unsigned char *out,
		 const unsigned char *in, unsigned int nunits,
		 unsigned int unit, uint64_t off, unsigned int iv_shift)
{
	unsigned char *ivs = (unsigned char *)x->ivs;
	unsigned char *tw = (unsigned char *)x->tweaks;
	unsigned int per_unit = unit / 16, u, j;
	size_t len = (size_t)nunits * unit, i;
	int outl;

	/* every unit's tweak, encrypted with key 2 in one call */
	for (u = 0; u < nunits; u++) {
		store64(ivs + 16 * u, (off + (uint64_t)u * unit) >> iv_shift);
		store64(ivs + 16 * u + 8, 0);
	}
	if (!EVP_CipherUpdate(x->tweak, ivs, &outl, ivs, nunits * 16) ||
	    outl != (int)(nunits * 16))
		return -EIO;

	/* each block's tweak, kept, and the input whitened with it */
	for (u = 0; u < nunits; u++) {
		uint64_t lo = load64(ivs + 16 * u);
		uint64_t hi = load64(ivs + 16 * u + 8);

		for (j = 0; j < per_unit; j++) {
			size_t b = ((size_t)u * per_unit + j) * 16;
			uint64_t carry = hi >> 63;

			store64(tw + b, lo);
			store64(tw + b + 8, hi);
			store64(out + b, load64(in + b) ^ lo);
			store64(out + b + 8, load64(in + b + 8) ^ hi);
			hi = (hi << 1) | (lo >> 63);
			lo = (lo << 1) ^ (0x87 & -carry);
		}
	}

	/* all of it through AES with key 1, then whitened again */
	if (!EVP_CipherUpdate(enc ? x->data_enc : x->data_dec, out, &outl,
			      out, (int)len) || outl != (int)len)
		return -EIO;
	for (i = 0; i < len; i += 8)
		store64(out + i, load64(out + i) ^ load64(tw + i));
	return 0;
}

int xts_crypt(struct xts *x, bool enc, unsigned char *out,
	      const unsigned char *in, size_t len, unsigned int unit,
	      uint64_t off, unsigned int iv_shift)
{
	unsigned int per_chunk;
	size_t done = 0;
	int ret;

	if (unit < MIN_UNIT || unit > CHUNK || unit % 16 || len % unit)
		return -EINVAL;
	per_chunk = CHUNK / unit;
	while (done < len) {
		size_t units = (len - done) / unit;

		if (units > per_chunk)
			units = per_chunk;
		ret = chunk(x, enc, out + done, in + done, units, unit,
			    off + done, iv_shift);
		if (ret) {
			ERR_clear_error();	/* this thread's queue */
			return ret;
		}
		done += units * unit;
	}
	return 0;
}
