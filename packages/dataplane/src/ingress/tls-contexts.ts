// Certificate selection of a listener (SPEC "listen.tls"): exact SNI match, else the legacy
// `cert`/`key`, else the first `certificates[]` entry. A missing or unmatched SNI gets that
// default identity; the handshake is never refused for its name.
import tls from 'node:tls';
import net from 'node:net';
import { X509Certificate } from 'node:crypto';
import type { ListenerMaterial, PemIdentity } from '@edge-proxy/config';

/** How a handshake's certificate was chosen (metric label `selection`). */
export type Selection = 'sni' | 'default' | 'first';

/** The secure contexts of one listener, replaced as a whole on activation and reload-certs. */
export class ListenerContexts {
  readonly defaultContext: tls.SecureContext;
  readonly defaultSelection: Selection;
  readonly defaultIdentity: PemIdentity;
  private readonly byName: ReadonlyMap<string, tls.SecureContext>;
  readonly identities: readonly { readonly serverName: string; readonly identity: PemIdentity }[];

  constructor(m: ListenerMaterial) {
    const make = (id: PemIdentity): tls.SecureContext => tls.createSecureContext({ cert: id.cert_pem, key: id.key_pem, ...(m.client_ca === undefined ? {} : { ca: [...m.client_ca.pems] }) });
    const first = m.certificates[0];
    const def = m.default ?? first?.identity;
    if (def === undefined) throw new Error('a listener needs a default identity or a certificates[] entry');
    this.defaultIdentity = def;
    this.defaultSelection = m.default !== undefined ? 'default' : 'first';
    this.defaultContext = make(def);
    this.defaultCert = new X509Certificate(def.cert_pem);
    this.byName = new Map(m.certificates.map((c) => [c.server_name.toLowerCase(), make(c.identity)]));
    this.identities = [...(m.default === undefined ? [] : [{ serverName: 'default', identity: m.default }]), ...m.certificates.map((c) => ({ serverName: c.server_name, identity: c.identity }))];
  }

  private readonly defaultCert: X509Certificate;
  private readonly covered = new Map<string, boolean>();

  /**
   * Whether the default identity (the one QUIC serves: one chain per QUIC server) is valid for
   * `host`; only then may a response advertise `Alt-Svc: h3`. Answers are cached per host name.
   */
  defaultCovers(host: string): boolean {
    const name = host.toLowerCase();
    let ok = this.covered.get(name);
    if (ok === undefined) {
      const literal = name.startsWith('[') ? name.slice(1, -1) : name;
      ok = net.isIP(literal) !== 0 ? this.defaultCert.checkIP(literal) !== undefined : this.defaultCert.checkHost(name) !== undefined;
      if (this.covered.size < 10_000) this.covered.set(name, ok);
    }
    return ok;
  }

  /** The context for a ClientHello's server name, and how it was chosen. */
  select(serverName: string | undefined): { context: tls.SecureContext; selection: Selection } {
    if (serverName !== undefined && serverName.length > 0) {
      const exact = this.byName.get(serverName.toLowerCase());
      if (exact !== undefined) return { context: exact, selection: 'sni' };
    }
    return { context: this.defaultContext, selection: this.defaultSelection };
  }
}
