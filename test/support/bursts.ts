// Bursts of requests in the three shapes the node-wide limit tests use (issue 39): each on a new
// HTTP/1.1 connection (the kernel spreads them over the workers), all on one HTTP/2 connection, all
// on one HTTP/3 connection (one worker takes them all); and the answers that came first, for a
// burst whose other requests a backend holds.
import { connectH2, connectH3, send } from './overload.ts';
import type { Answer, Proxy } from './overload.ts';

export type Shape = 'spread' | 'h2' | 'h3';

export const SHAPES: readonly Shape[] = ['spread', 'h2', 'h3'];

/** `n` requests on `path`/i (or on `paths(i)`) in the shape's way; their answers as they come. */
export async function fire(t: { teardown(fn: () => unknown): void }, p: Proxy, shape: Shape, path: string | ((i: number) => string), n: number, timeoutMs = 30_000): Promise<Promise<Answer>[]> {
  const h2 = shape === 'h2' ? await connectH2(t, p) : undefined;
  const h3 = shape === 'h3' ? await connectH3(t, p) : undefined;
  return Array.from({ length: n }, (_, i) => {
    const o = { path: typeof path === 'string' ? `${path}/${i}` : path(i), timeoutMs };
    return h2?.request(o) ?? h3?.request(o) ?? send(p, 'h1', o).answer;
  });
}

/**
 * Resolves with the first `count` answers of `answers`, in the order they came, without waiting for
 * the rest; or, after `withinMs`, with the fewer that came by then (the caller asserts the count:
 * a proxy that lets too many requests wait fails fast instead of at the clients' timeout).
 */
export async function firstAnswers(answers: readonly Promise<Answer>[], count: number, withinMs = Infinity): Promise<Answer[]> {
  const got: Answer[] = [];
  let timer: NodeJS.Timeout | undefined;
  await new Promise<void>((resolve) => {
    if (count === 0) resolve();
    if (withinMs !== Infinity) timer = setTimeout(resolve, withinMs);
    for (const a of answers)
      void a.then((x) => {
        got.push(x);
        if (got.length === count) resolve();
      });
  });
  clearTimeout(timer);
  return got.slice(0, count);
}

/** The `upstream` map (YAML flow style) of pools `names`, each routed by `/<name>` to the one backend `be`. */
export function pools(be: { readonly name: string; readonly port: number }, names: readonly string[]): string {
  return `{ ${names.map((n) => `${n}: { route: { path_prefix: /${n} }, backends: [{ id: ${be.name}, address: "127.0.0.1:${be.port}" }] }`).join(', ')} }`;
}
