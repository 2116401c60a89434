// What the TLS bootstrap ingress does with a connection node reports through 'clientError'.
// Two kinds arrive there: TLS-level failures of the handshake (node:http2's secure server forwards
// 'tlsClientError' to 'clientError', and its own default, destroying the socket, runs only when
// nobody listens: with our listener a failed or timed-out handshake stayed open for ever), and
// HTTP/1.1 failures on an established connection (parser errors, node's header timeout).
// Either way the connection is destroyed; an HTTP/1.1 failure first gets a one-line answer.

const CLOSE = 'connection: close\r\ncontent-length: 0\r\n\r\n';

/**
 * The raw HTTP/1.1 answer to a client error with this `code` before the connection is destroyed,
 * or undefined to destroy it without one (not an HTTP-level failure, or the peer reset it).
 */
export function clientErrorReply(code: string): string | undefined {
  // node's header and request timeouts (slowloris): RFC 9110 §15.5.9.
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return `HTTP/1.1 408 Request Timeout\r\n${CLOSE}`;
  if (code === 'HPE_HEADER_OVERFLOW') return `HTTP/1.1 431 Request Header Fields Too Large\r\n${CLOSE}`;
  if (code.startsWith('HPE_')) return `HTTP/1.1 400 Bad Request\r\n${CLOSE}`;
  return undefined;
}
