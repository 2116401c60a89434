// What the TLS bootstrap ingress does with a connection node reports through 'clientError'.
// Two kinds arrive there: TLS-level failures of the handshake (node:http2's secure server forwards
// 'tlsClientError' to 'clientError', and its own default, destroying the socket, runs only when
// nobody listens: with our listener a failed or timed-out handshake stayed open for ever), and
// HTTP/1.1 failures on an established connection (parser errors, node's header timeout).
// Either way the connection is closed; an HTTP/1.1 failure first gets a one-line answer.
//
// Pipelining (RFC 9112 §9.3.2): node parses every request in a read at once, so valid requests
// followed by a malformed one in the same bytes are already running (or answered but still
// queued behind an earlier response) when the parser fails on the last one. Their responses are
// delivered, in order, before the 400 and the close: the backend ran those requests, and a
// client must not be left guessing which of them took effect.
import type { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';

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

/** What node's HTTP/1.1 server keeps on a connection's socket (not in the typings). */
interface Http1Socket extends Socket {
  /** The response being written on the connection; later pipelined ones wait in node's queue for it to finish. */
  _httpMessage?: (EventEmitter & { readonly headersSent?: boolean }) | null;
  /** The parser and the request it is reading (`complete` false: inside its body). */
  parser?: { readonly incoming?: { readonly complete?: boolean } | null } | null;
}

/** Connections already being closed for a client error: llhttp reports its error again for every later read. */
const CLOSING = new WeakSet<Socket>();

/**
 * Closes `socket` after a client error, with `reply` (see `clientErrorReply`) when there is one.
 * A response already begun on the connection and the pipelined ones queued behind it are
 * delivered first, each as node writes it; then the reply goes out and the connection is ended.
 * An error inside a request body (the request itself is broken, and its response may be under way)
 * destroys the connection at once, with the reply only if no response has begun. The connection is
 * destroyed at the latest `lingerMs` after the reply, if the peer does not take it.
 */
export function closeAfterClientError(socket: Socket, reply: string | undefined, lingerMs: number): void {
  if (CLOSING.has(socket)) return;
  CLOSING.add(socket);
  const s = socket as Http1Socket;
  const incoming = s.parser?.incoming;
  if (reply === undefined || (incoming != null && incoming.complete === false)) {
    // `_httpMessage`: a raw answer must not land inside a response in progress (node's own default handler checks it too).
    if (reply !== undefined && socket.writable && s._httpMessage?.headersSent !== true) socket.write(reply);
    socket.destroy();
    return;
  }
  const finish = (): void => {
    if (socket.destroyed) return;
    if (!socket.writable) {
      // The last response closed the connection itself (`connection: close`).
      socket.destroy();
      return;
    }
    const timer = setTimeout(() => socket.destroy(), lingerMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
    socket.end(reply, () => socket.destroy());
  };
  const awaitResponses = (): void => {
    const msg = s._httpMessage;
    if (msg == null || socket.destroyed) {
      finish();
      return;
    }
    // node's own 'finish' listener (added first) hands the connection to the next queued response
    // before this one runs; 'close' alone: the response was aborted (the connection is going).
    let moved = false;
    const next = (): void => {
      if (moved) return;
      moved = true;
      awaitResponses();
    };
    msg.once('finish', next);
    msg.once('close', next);
  };
  awaitResponses();
}
