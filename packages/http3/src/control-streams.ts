// The connection-level streams of HTTP/3, for either role: our control stream with SETTINGS
// (RFC 9114 §6.2.1), our QPACK encoder and decoder streams (RFC 9204 §4.2), and the peer's
// unidirectional streams: its control stream (SETTINGS first, then GOAWAY...), its QPACK streams
// feeding our decoder and encoder, push streams refused, unknown types ignored (RFC 9114 §6.2).
// Every violation found here is a connection error, reported through `onConnectionError`.

import type { QUICConnection, QUICStream } from '@matrixai/quic';
import { concatBytes } from './byte-writer.ts';
import { H3Error, isH3Error } from './errors.ts';
import { FrameReader } from './frame-reader.ts';
import { encodeGoawayFrame, encodeSettingsFrame } from './frames.ts';
import { peerCodeOf } from './quic-adapter.ts';
import { QpackDecoder } from './qpack/decoder.ts';
import type { UnblockedSection } from './qpack/decoder.ts';
import { QpackEncoder } from './qpack/encoder.ts';
import { DEFAULT_SETTINGS } from './settings.ts';
import type { Http3Settings } from './settings.ts';
import { STREAM_TYPE, encodeStreamType, parseStreamType } from './stream-types.ts';
import type { Http3Role } from './stream-types.ts';
import { StreamIo } from './stream-io.ts';

/** Settings and QPACK choices of one side of a connection. */
export interface ControlStreamsOptions {
  role: Http3Role;
  /** SETTINGS_MAX_FIELD_SECTION_SIZE we advertise and enforce on received sections, bytes (RFC 9114 §4.2.2). */
  maxFieldSectionSize: number;
  /** SETTINGS_QPACK_MAX_TABLE_CAPACITY we advertise, bytes (RFC 9204 §3.2.3). */
  qpackMaxTableCapacity: number;
  /** SETTINGS_QPACK_BLOCKED_STREAMS we advertise (RFC 9204 §2.1.2). */
  qpackBlockedStreams: number;
  /** Let our encoder use the dynamic table the peer allows. */
  qpackEncoderDynamicTable: boolean;
  /** A connection error: close the connection with `err.wireCode`. */
  onConnectionError(err: H3Error): void;
  /** The peer sent GOAWAY (RFC 9114 §5.2) with this stream or push ID. */
  onGoaway(id: number): void;
  /** Blocked field sections that encoder-stream data made decodable, for their request streams. */
  onUnblocked(sections: UnblockedSection[]): void;
  /**
   * Tests and probes write our QPACK encoder stream themselves: read the peer's decoder stream
   * but do not apply it to our (unused) encoder. Default false.
   */
  externalEncoder?: boolean;
}

type CriticalKind = 'control' | 'qpack-encoder' | 'qpack-decoder';

/** The control and QPACK streams of one HTTP/3 connection. */
export class ControlStreams {
  /** Our QPACK encoder: encodes the field sections we send. */
  readonly encoder: QpackEncoder;
  /** Our QPACK decoder: decodes the field sections we receive. */
  readonly decoder: QpackDecoder;
  private readonly options: ControlStreamsOptions;
  private settings: Http3Settings | undefined;
  private control: StreamIo | undefined;
  private encoderOut: StreamIo | undefined;
  private decoderOut: StreamIo | undefined;
  private readonly peerCritical = new Set<CriticalKind>();
  private readonly peerUni = new Set<StreamIo>();
  private lastGoawayId = Infinity;
  private closing = false;

  constructor(options: ControlStreamsOptions) {
    this.options = options;
    this.encoder = new QpackEncoder({ dynamicTable: options.qpackEncoderDynamicTable });
    this.decoder = new QpackDecoder({
      maxTableCapacity: options.qpackMaxTableCapacity,
      maxBlockedStreams: options.qpackBlockedStreams,
      maxFieldSectionSize: options.maxFieldSectionSize,
    });
  }

  /** The peer's SETTINGS, or the RFC defaults until they arrive (RFC 9114 §7.2.4.2). */
  get peerSettings(): Readonly<Http3Settings> {
    return this.settings ?? DEFAULT_SETTINGS;
  }

  /** True once the peer's SETTINGS frame was received. */
  get peerSettingsReceived(): boolean {
    return this.settings !== undefined;
  }

  /** Peer unidirectional streams currently read (control, QPACK, or not yet typed). */
  get peerUniStreams(): number {
    return this.peerUni.size;
  }

  /**
   * Opens our control stream with SETTINGS and our QPACK streams (RFC 9114 §6.2.1: SETTINGS is
   * the first frame; RFC 9204 §4.2). Call once the connection is established.
   */
  open(conn: QUICConnection): void {
    try {
      this.control = new StreamIo(conn.newStream('uni'));
      const settings = encodeSettingsFrame({
        maxFieldSectionSize: this.options.maxFieldSectionSize,
        qpackMaxTableCapacity: this.options.qpackMaxTableCapacity,
        qpackBlockedStreams: this.options.qpackBlockedStreams,
      });
      this.send(this.control, concatBytes([encodeStreamType(STREAM_TYPE.CONTROL), settings]));
      this.encoderOut = new StreamIo(conn.newStream('uni'));
      this.send(this.encoderOut, encodeStreamType(STREAM_TYPE.QPACK_ENCODER));
      this.decoderOut = new StreamIo(conn.newStream('uni'));
      this.send(this.decoderOut, encodeStreamType(STREAM_TYPE.QPACK_DECODER));
    } catch (err) {
      // The connection closed under us, or the peer allows too few unidirectional streams
      // (RFC 9114 §6.2: it must allow at least 3); either way HTTP/3 cannot run.
      if (!this.closing) this.options.onConnectionError(new H3Error('H3_STREAM_CREATION_ERROR', 'cannot open the control and QPACK streams', { cause: err }));
    }
  }

  /** Marks the connection as closing: streams ending now are not protocol errors. */
  markClosing(): void {
    this.closing = true;
  }

  /** Sends GOAWAY with `id` on our control stream (RFC 9114 §5.2). */
  sendGoaway(id: number): void {
    if (this.control !== undefined) this.send(this.control, encodeGoawayFrame(id));
  }

  /** Sends queued encoder instructions; call after encoding a field section. */
  flushEncoder(): void {
    const bytes = this.encoder.pendingEncoderStreamBytes();
    if (bytes.length > 0 && this.encoderOut !== undefined) this.send(this.encoderOut, bytes);
  }

  /** Sends queued decoder instructions (acks, increments, cancellations). */
  flushDecoder(): void {
    const bytes = this.decoder.pendingDecoderStreamBytes();
    if (bytes.length > 0 && this.decoderOut !== undefined) this.send(this.decoderOut, bytes);
  }

  /** Reads a peer-initiated unidirectional stream until it ends or the connection closes. */
  acceptUni(stream: QUICStream): void {
    const io = new StreamIo(stream);
    this.peerUni.add(io);
    void this.readUni(io).finally(() => this.peerUni.delete(io));
  }

  private send(io: StreamIo, bytes: Uint8Array): void {
    io.write(bytes).catch((err: unknown) => {
      // RFC 9114 §6.2.1: the peer must never ask us to stop our control or QPACK streams.
      if (!this.closing && peerCodeOf(err) !== undefined) {
        this.options.onConnectionError(new H3Error('H3_CLOSED_CRITICAL_STREAM', 'the peer stopped one of our critical streams'));
      }
    });
  }

  private async readUni(io: StreamIo): Promise<void> {
    let kind: CriticalKind | undefined;
    try {
      let head: Uint8Array = new Uint8Array(0);
      let parsed = null;
      while (parsed === null) {
        const chunk = await io.read();
        if (chunk === null) return; // ended before its type: nothing to do (RFC 9114 §6.2)
        head = head.length === 0 ? chunk : concatBytes([head, chunk]);
        parsed = parseStreamType(head, this.options.role); // a push stream to a server throws
      }
      const rest = head.subarray(parsed.length);
      if (parsed.kind === 'unknown') {
        // RFC 9114 §6.2: abort reading unknown stream types, never fail the connection.
        io.stopReading(new H3Error('H3_STREAM_CREATION_ERROR', 'unknown stream type', { scope: 'stream' }));
        return;
      }
      if (parsed.kind === 'push') {
        // RFC 9114 §4.6: we never sent MAX_PUSH_ID, so any push ID exceeds the maximum.
        throw new H3Error('H3_ID_ERROR', 'push stream received but push was never permitted');
      }
      kind = parsed.kind;
      if (this.peerCritical.has(kind)) {
        // RFC 9114 §6.2.1, RFC 9204 §4.2: a second stream of a critical type.
        throw new H3Error('H3_STREAM_CREATION_ERROR', `a second ${kind} stream`);
      }
      this.peerCritical.add(kind);
      const handle = this.handlerFor(kind);
      if (rest.length > 0) handle(rest);
      for (;;) {
        const chunk = await io.read();
        if (chunk === null) break;
        handle(chunk);
      }
      if (!this.closing) throw new H3Error('H3_CLOSED_CRITICAL_STREAM', `the peer closed its ${kind} stream`);
    } catch (err) {
      if (this.closing) return;
      if (peerCodeOf(err) !== undefined) {
        if (kind !== undefined) this.options.onConnectionError(new H3Error('H3_CLOSED_CRITICAL_STREAM', `the peer reset its ${kind} stream`));
        return;
      }
      if (isH3Error(err)) this.options.onConnectionError(err as H3Error);
      // Anything else is the library tearing the stream down with its connection.
    }
  }

  private handlerFor(kind: CriticalKind): (chunk: Uint8Array) => void {
    switch (kind) {
      case 'control': {
        const reader = new FrameReader({ stream: 'control', role: this.options.role, maxFramePayload: 16384 });
        return (chunk) => {
          for (const frame of reader.push(chunk)) this.onControlFrame(frame);
        };
      }
      case 'qpack-encoder':
        return (chunk) => {
          const ready = this.decoder.onEncoderStreamData(chunk);
          if (ready.length > 0) this.options.onUnblocked(ready);
          this.flushDecoder();
        };
      case 'qpack-decoder':
        if (this.options.externalEncoder === true) return () => {};
        return (chunk) => this.encoder.onDecoderStreamData(chunk);
    }
  }

  private onControlFrame(frame: ReturnType<FrameReader['push']>[number]): void {
    switch (frame.type) {
      case 'settings':
        this.settings = frame.settings;
        this.encoder.setPeerSettings(frame.settings);
        this.flushEncoder();
        return;
      case 'goaway':
        // RFC 9114 §5.2: the ID may only stay the same or decrease.
        if (frame.id > this.lastGoawayId) throw new H3Error('H3_ID_ERROR', `GOAWAY ID ${frame.id} is larger than the previous ${this.lastGoawayId}`);
        this.lastGoawayId = frame.id;
        this.options.onGoaway(frame.id);
        return;
      case 'cancel_push':
        // RFC 9114 §7.2.3: a CANCEL_PUSH naming a push that was never promised is H3_ID_ERROR;
        // we never promise (server) nor permit (client) a push.
        throw new H3Error('H3_ID_ERROR', 'CANCEL_PUSH for a push that was never promised');
      case 'max_push_id':
        return; // we never push, so the limit does not matter
      default:
        return; // the FrameReader rejects every other frame on a control stream
    }
  }
}
