// Maglev consistent hashing (Eisenbud et al., NSDI 2016): a lookup table of prime size M filled
// from per-backend permutations. Removing one of N backends remaps about 1/N of the keys; weights
// give a backend proportionally more turns while the table fills.
import { hash32 } from './hash.ts';
import type { BackendRef } from './selector.ts';

/** Smallest prime >= n. */
function nextPrime(n: number): number {
  const isPrime = (x: number): boolean => {
    if (x < 2) return false;
    for (let d = 2; d * d <= x; d++) if (x % d === 0) return false;
    return true;
  };
  let p = n;
  while (!isPrime(p)) p++;
  return p;
}

/** Table size: at least 100 slots per backend turn (the paper's M >> N), at least 65537. */
export function tableSize(backends: readonly BackendRef[]): number {
  const turns = backends.reduce((s, b) => s + Math.max(0, b.weight), 0);
  return nextPrime(Math.max(65_537, turns * 100));
}

/** Builds the lookup table: slot → index into `backends` (-1 when no backend has weight). */
export function buildMaglevTable(backends: readonly BackendRef[], size = tableSize(backends)): Int32Array {
  const table = new Int32Array(size).fill(-1);
  const live = backends.map((b, i) => ({ b, i })).filter(({ b }) => b.weight > 0);
  if (live.length === 0) return table;
  const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b));
  const g = live.reduce((acc, { b }) => gcd(acc, b.weight), 0);
  const offset = live.map(({ b }) => hash32(b.key, 0x9e3779b9) % size);
  const skip = live.map(({ b }) => (hash32(b.key, 0x85ebca6b) % (size - 1)) + 1);
  const next = new Array<number>(live.length).fill(0);
  let filled = 0;
  while (filled < size) {
    for (let j = 0; j < live.length && filled < size; j++) {
      const turns = (live[j]?.b.weight ?? 0) / g;
      for (let t = 0; t < turns && filled < size; t++) {
        let slot = ((offset[j] as number) + (next[j] as number) * (skip[j] as number)) % size;
        while (table[slot] !== -1) {
          next[j] = (next[j] as number) + 1;
          slot = ((offset[j] as number) + (next[j] as number) * (skip[j] as number)) % size;
        }
        table[slot] = live[j]?.i ?? -1;
        next[j] = (next[j] as number) + 1;
        filled++;
      }
    }
  }
  return table;
}
