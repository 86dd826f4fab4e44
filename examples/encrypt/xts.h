/* SPDX-License-Identifier: MIT */
/*
 * xts.h - AES-XTS (IEEE 1619) over many data units in one pass.
 *
 * OpenSSL's XTS cipher takes one data unit (one sector) per call, with its
 * tweak set by a cipher re-init; at 512-byte sectors that re-init costs
 * about as much as the AES itself.  Here XTS is computed from its
 * definition with AES-ECB instead, which OpenSSL runs many blocks at a
 * time: the tweaks of all the units in a chunk are encrypted in one ECB
 * call, each unit's block tweaks follow by multiplication by alpha in
 * GF(2^128), and the whole chunk is whitened, en- or decrypted in one ECB
 * call, and whitened again.  The result is byte for byte OpenSSL's XTS
 * (and dm-crypt's); test_xts checks it against OpenSSL's.
 *
 * Data units are whole multiples of 16 bytes (no ciphertext stealing);
 * the tweak of the unit at byte offset OFF is the plain64 IV, OFF >>
 * iv_shift as a little-endian 64-bit integer, zero-padded to 16 bytes.
 */
#ifndef ENCRYPT_XTS_H
#define ENCRYPT_XTS_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One thread's: the contexts hold the key schedules. */
struct xts {
	EVP_CIPHER_CTX *data_enc, *data_dec;	/* AES-ECB, key 1 */
	EVP_CIPHER_CTX *tweak;			/* AES-ECB encrypt, key 2 */
	uint64_t *tweaks;			/* a chunk's, 2 words each */
	uint64_t *ivs;				/* a chunk's units' */
};

/*
 * key is key 1 then key 2, key_len 32 (AES-128) or 64 (AES-256) bytes.
 * Returns 0, or -EINVAL for a length other than those, -ENOMEM.  It does
 * not check that the halves differ: OpenSSL's XTS refuses those, so ask
 * it first.
 */
int xts_init(struct xts *x, const unsigned char *key, size_t key_len);

/* Wipes the key schedules and the tweaks; x may be zeroed or half-built. */
void xts_fini(struct xts *x);

/*
 * En- (enc) or decrypt len bytes from in to out (the same buffer, or not
 * overlapping), unit bytes per data unit (512 to 128 KiB, a multiple of
 * 16; len a multiple of it), the first unit at device byte off.  Returns
 * 0, -EINVAL for a unit or length it cannot take, or -EIO (OpenSSL
 * failed; out is then garbage).
 */
int xts_crypt(struct xts *x, bool enc, unsigned char *out,
	      const unsigned char *in, size_t len, unsigned int unit,
	      uint64_t off, unsigned int iv_shift);

#endif
