// SPDX-License-Identifier: MIT
/*
 * test_xts - xts.c against OpenSSL's own XTS cipher, one data unit per
 * call as dm-crypt does it: both key sizes, 512- and 4096-byte units,
 * both IV counts, random lengths (past a chunk) and offsets (past 2^32
 * sectors), in place and not, both directions, each checked against
 * OpenSSL's other direction; and what it refuses.
 * Prints "N passed, N failed"; exits non-zero on a failure.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xts.h"

#define MAX_LEN	(1U << 20)

static int passed, failed;

static void check(int ok, const char *what, unsigned int key_len,
		  unsigned int unit, size_t len, unsigned long long off)
{
	if (ok) {
		passed++;
		return;
	}
	failed++;
	if (failed <= 10)
		printf("FAILED: %s (key %u bytes, unit %u, %zu bytes at %llu)\n",
		       what, key_len, unit, len, off);
}

/* The reference: OpenSSL's XTS, a re-init with each unit's IV. */
static int reference(EVP_CIPHER_CTX *ctx, unsigned char *out,
		     const unsigned char *in, size_t len, unsigned int unit,
		     uint64_t off, unsigned int iv_shift)
{
	unsigned char iv[16];
	size_t done;
	int outl;

	for (done = 0; done < len; done += unit) {
		uint64_t n = (off + done) >> iv_shift;

		memset(iv, 0, sizeof(iv));
		for (int i = 0; i < 8; i++)
			iv[i] = n >> (8 * i);
		if (!EVP_CipherInit_ex2(ctx, NULL, NULL, iv, -1, NULL) ||
		    !EVP_CipherUpdate(ctx, out + done, &outl, in + done,
				      (int)unit))
			return -1;
	}
	return 0;
}

static void fill(unsigned char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)random();
}

int main(void)
{
	unsigned char *plain = malloc(MAX_LEN), *want = malloc(MAX_LEN);
	unsigned char *got = malloc(MAX_LEN), key[64];
	struct xts x;

	if (!plain || !want || !got)
		return 2;
	srandom(1619);
	for (unsigned int key_len = 32; key_len <= 64; key_len += 32) {
		const EVP_CIPHER *cipher = key_len == 32 ? EVP_aes_128_xts() :
							   EVP_aes_256_xts();
		EVP_CIPHER_CTX *enc = EVP_CIPHER_CTX_new();
		EVP_CIPHER_CTX *dec = EVP_CIPHER_CTX_new();

		fill(key, sizeof(key));
		if (!enc || !dec ||
		    !EVP_CipherInit_ex2(enc, cipher, key, NULL, 1, NULL) ||
		    !EVP_CipherInit_ex2(dec, cipher, key, NULL, 0, NULL) ||
		    xts_init(&x, key, key_len)) {
			printf("FAILED: setting up key size %u\n", key_len);
			return 1;
		}
		for (int t = 0; t < 64; t++) {
			unsigned int unit = t % 2 ? 4096 : 512;
			unsigned int iv_shift = unit == 4096 && t % 4 == 3 ?
						12 : 9;
			size_t len = (size_t)unit *
				     (1 + random() % (MAX_LEN / unit));
			uint64_t off = ((uint64_t)random() << 20 |
					(uint64_t)random()) * unit;

			if (t < 4)	/* short ones too */
				len = unit * (t + 1);
			fill(plain, len);
			if (reference(enc, want, plain, len, unit, off,
				      iv_shift)) {
				printf("FAILED: OpenSSL's XTS\n");
				return 1;
			}
			check(!xts_crypt(&x, true, got, plain, len, unit, off,
					 iv_shift) && !memcmp(got, want, len),
			      "encrypt", key_len, unit, len, off);
			/* decrypt in place: back to the plaintext */
			check(!xts_crypt(&x, false, got, got, len, unit, off,
					 iv_shift) && !memcmp(got, plain, len),
			      "decrypt in place", key_len, unit, len, off);
			/* encrypt in place: OpenSSL decrypts it */
			memcpy(got, plain, len);
			check(!xts_crypt(&x, true, got, got, len, unit, off,
					 iv_shift) &&
			      !reference(dec, want, got, len, unit, off,
					 iv_shift) && !memcmp(want, plain, len),
			      "OpenSSL decrypts ours", key_len, unit, len,
			      off);
			/* decrypt OpenSSL's, not in place */
			check(!xts_crypt(&x, false, want, got, len, unit, off,
					 iv_shift) && !memcmp(want, plain, len),
			      "decrypt, not in place", key_len, unit, len,
			      off);
		}
		check(xts_crypt(&x, true, got, plain, 1000, 512, 0, 9) ==
		      -EINVAL, "a length not a whole unit", key_len, 512,
		      1000, 0);
		check(xts_crypt(&x, true, got, plain, 256, 256, 0, 9) ==
		      -EINVAL, "a unit under 512 bytes", key_len, 256, 256,
		      0);
		check(xts_crypt(&x, true, got, plain, 0, 512, 0, 9) == 0,
		      "nothing", key_len, 512, 0, 0);
		xts_fini(&x);
		EVP_CIPHER_CTX_free(enc);
		EVP_CIPHER_CTX_free(dec);
	}
	check(xts_init(&x, key, 48) == -EINVAL, "a 48-byte key", 48, 0, 0, 0);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
