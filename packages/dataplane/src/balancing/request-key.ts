// Request key specs (`client_ip`, `host`, `path`, `route`, `header:NAME`, `cookie:NAME`,
// `query:NAME`) compiled once per pool into an extractor. Shared by consistent hashing, scoped rate
// limits and quota selectors. A missing value falls back to the client IP, so every request hashes.

/** What an extractor reads from a request; header names are lower case. */
export interface KeySource {
  readonly clientIp: string;
  readonly host: string;
  readonly path: string;
  readonly route: string;
  header(name: string): string | undefined;
}

export type KeyExtractor = (req: KeySource) => string;

function cookieValue(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq !== -1 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

function queryValue(path: string, name: string): string | undefined {
  const q = path.indexOf('?');
  if (q === -1) return undefined;
  for (const pair of path.slice(q + 1).split('&')) {
    const eq = pair.indexOf('=');
    const k = eq === -1 ? pair : pair.slice(0, eq);
    if (safeDecode(k) === name) return eq === -1 ? '' : safeDecode(pair.slice(eq + 1));
  }
  return undefined;
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return s;
  }
}

/** Compiles a key spec (validated by the config rules) into an extractor. */
export function compileKeySpec(spec: string): KeyExtractor {
  const colon = spec.indexOf(':');
  const kind = colon === -1 ? spec : spec.slice(0, colon);
  const name = colon === -1 ? '' : spec.slice(colon + 1);
  switch (kind) {
    case 'host':
      return (r) => r.host || r.clientIp;
    case 'path':
      return (r) => {
        const q = r.path.indexOf('?');
        return q === -1 ? r.path : r.path.slice(0, q);
      };
    case 'route':
      return (r) => r.route;
    case 'header': {
      const lower = name.toLowerCase();
      return (r) => r.header(lower) ?? r.clientIp;
    }
    case 'cookie':
      return (r) => cookieValue(r.header('cookie'), name) ?? r.clientIp;
    case 'query':
      return (r) => queryValue(r.path, name) ?? r.clientIp;
    default:
      return (r) => r.clientIp;
  }
}
