// Non-cryptographic string hashing for request keys and Maglev permutations: FNV-1a over UTF-16
// code units, finished with the MurmurHash3 fmix32 avalanche so that nearby keys spread well.

/** 32-bit hash of `s` with `seed`. */
export function hash32(s: string, seed = 0): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  // fmix32 (MurmurHash3 finalizer)
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
