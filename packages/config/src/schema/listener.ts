// Downstream listeners (SPEC "Configuration (YAML)": `listen` / `listeners[]` and their `tls`).
import { Type } from '@sinclair/typebox';
import type { Static } from '@sinclair/typebox';
import { Enum, Obj, Port } from './common.ts';

/** One SNI-selected certificate of a listener. */
export const ListenerCertificate = Obj(
  {
    server_name: Type.String({ minLength: 1, maxLength: 253, description: 'exact SNI DNS name; must be covered by the certificate SANs', 'x-example': 'api.example.com' }),
    cert: Type.String({ minLength: 1, description: 'path of the PEM certificate chain', 'x-example': '/etc/edge-proxy/tls/api.crt' }),
    key: Type.String({ minLength: 1, description: 'path of the PEM private key', 'x-example': '/etc/edge-proxy/tls/api.key' }),
  },
  { description: 'certificate selected when the client sends this exact SNI name' },
);

/** Client certificate authentication on a TLS surface. */
export const ClientAuth = Obj(
  {
    mode: Enum(['optional', 'required'], {
      description: '`required`: a missing or invalid client certificate fails the handshake (on a listener, QUIC included); `optional`: verified when presented (a listener\'s QUIC ingress asks for none: quiche can only require one)',
      'x-example': 'required',
    }),
    ca_file: Type.String({ minLength: 1, description: 'PEM bundle of the CAs that issue client certificates', 'x-example': '/etc/edge-proxy/tls/clients-ca.pem' }),
  },
  { description: 'client certificate (mTLS) policy' },
);

/** TLS identity of a listener: a legacy/default `cert`/`key` pair and/or SNI `certificates[]`. */
export const ListenerTls = Obj(
  {
    cert: Type.Optional(Type.String({ minLength: 1, description: 'path of the default PEM certificate chain (with `key`)', 'x-example': '/etc/edge-proxy/tls/default.crt' })),
    key: Type.Optional(Type.String({ minLength: 1, description: 'path of the default PEM private key (with `cert`)', 'x-example': '/etc/edge-proxy/tls/default.key' })),
    certificates: Type.Array(ListenerCertificate, {
      maxItems: 4096,
      default: [],
      description: 'SNI certificates. Selection: exact SNI match, else `cert`/`key`, else the first entry',
    }),
    client_auth: Type.Optional(ClientAuth),
  },
  { description: 'downstream TLS (QUIC and the TLS bootstrap ingress)' },
);

/** A downstream listener: one QUIC (UDP) socket and one TLS bootstrap (TCP) socket on the same port. */
export const Listener = Obj(
  {
    name: Type.Optional(
      Type.String({
        pattern: '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$',
        description: 'name used in metrics, logs and the runtime snapshot; default `<address>:<port>`',
        'x-example': 'public',
      }),
    ),
    protocol: Enum(['http3'], { default: 'http3', description: 'ingress protocol; only `http3` (the TLS bootstrap path serves HTTP/1.1 and HTTP/2 beside it)' }),
    address: Type.String({ minLength: 1, default: '0.0.0.0', description: 'IP address to bind (IPv4 or IPv6; `::` binds both families)' }),
    port: Port(9889, 'UDP port for QUIC and TCP port for the TLS bootstrap ingress'),
    tls: ListenerTls,
    alt_svc_max_age_s: Type.Integer({ minimum: 0, maximum: 31_536_000, default: 86400, description: '`ma` of the `Alt-Svc: h3` header advertised on bootstrap responses', 'x-unit': 's' }),
  },
  { description: 'a downstream listener' },
);

export type ListenerConfig = Static<typeof Listener>;
export type ListenerTlsConfig = Static<typeof ListenerTls>;
export type ClientAuthConfig = Static<typeof ClientAuth>;
