/**
 * An HTTP/2 client written frame by frame on a raw TCP socket, for the front-door tests that
 * must send what no HTTP/2 library sends: a frame trickled byte by byte, a header block cut
 * into CONTINUATION frames sent slowly. It behaves like a client in the rest: it acknowledges
 * the server's SETTINGS, and its PINGs — but, as the protocol leaves no other choice, only
 * between two of its own frames (an answer queued while a frame is half sent goes out once
 * that frame is complete).
 */
import { connect, type Socket } from "node:net";

export const FRAME = { DATA: 0, HEADERS: 1, RST_STREAM: 3, SETTINGS: 4, PING: 6, GOAWAY: 7, WINDOW_UPDATE: 8, CONTINUATION: 9 } as const;
export const FLAG = { END_STREAM: 1, ACK: 1, END_HEADERS: 4 } as const;

export interface Frame {
  type: number;
  flags: number;
  stream: number;
  payload: Buffer;
  /** performance.now() when it arrived. */
  at: number;
}

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

export function frame(type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, payload]);
}

/** A header block of literal fields without indexing (RFC 7541 §6.2.2); names and values under 127 bytes. */
export function headerBlock(headers: [string, string][]): Buffer {
  const parts: Buffer[] = [];
  for (const [name, value] of headers) {
    if (name.length > 126 || value.length > 126) throw new RangeError("literal too long for this encoder");
    parts.push(Buffer.from([0x00, name.length]), Buffer.from(name, "latin1"), Buffer.from([value.length]), Buffer.from(value, "latin1"));
  }
  return Buffer.concat(parts);
}

export class RawH2 {
  readonly frames: Frame[] = [];
  closed = false;
  closedAt = 0;
  /** PINGs the server sent, and those answered. */
  pings = 0;
  answeredPings = 0;
  private buffer = Buffer.alloc(0);
  private midFrame = false;
  private readonly owed: Buffer[] = [];

  private constructor(readonly socket: Socket) {
    socket.on("data", (chunk: Buffer) => this.read(chunk));
    socket.on("error", () => {});
    socket.on("close", () => {
      this.closed = true;
      this.closedAt = performance.now();
    });
  }

  /** Connects, sends the preface and an empty SETTINGS frame. */
  static open(port: number): Promise<RawH2> {
    return new Promise((resolve, reject) => {
      const socket = connect({ host: "127.0.0.1", port }, () => {
        socket.off("error", reject);
        const client = new RawH2(socket);
        socket.write(Buffer.concat([PREFACE, frame(FRAME.SETTINGS, 0, 0)]));
        resolve(client);
      });
      socket.once("error", reject);
    });
  }

  /** Sends whole frames (between frames: owed PING answers go first). */
  send(...frames: Buffer[]): void {
    this.payOwed();
    if (!this.closed) this.socket.write(Buffer.concat(frames));
  }

  /**
   * Writes `bytes` one at a time, `everyMs` apart, as the inside of one frame (no PING can be
   * answered meanwhile). Resolves with the count written when done or when the server closes.
   */
  async trickle(bytes: Buffer, everyMs: number): Promise<number> {
    this.payOwed();
    this.midFrame = true;
    let written = 0;
    try {
      for (const byte of bytes) {
        if (this.closed) break;
        this.socket.write(Buffer.from([byte]));
        written++;
        await new Promise((resolve) => setTimeout(resolve, everyMs));
      }
    } finally {
      this.midFrame = false;
    }
    return written;
  }

  /**
   * Marks the client inside a header block (between HEADERS and its last CONTINUATION), where
   * no other frame may be sent (RFC 9113 §6.10); `false` ends it and sends what is owed.
   */
  insideBlock(inside: boolean): void {
    this.midFrame = inside;
    if (!inside) this.payOwed();
  }

  /** Frames of `type` received so far. */
  received(type: number): Frame[] {
    return this.frames.filter((f) => f.type === type);
  }

  close(): void {
    this.socket.destroy();
  }

  private payOwed(): void {
    while (this.owed.length > 0 && !this.closed) {
      const owed = this.owed.shift()!;
      this.socket.write(owed);
      if (owed[3] === FRAME.PING) this.answeredPings++;
    }
  }

  private read(chunk: Buffer): void {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    while (this.buffer.length >= 9) {
      const length = this.buffer.readUIntBE(0, 3);
      if (this.buffer.length < 9 + length) break;
      const f: Frame = {
        type: this.buffer[3]!,
        flags: this.buffer[4]!,
        stream: this.buffer.readUInt32BE(5) & 0x7fffffff,
        payload: Buffer.from(this.buffer.subarray(9, 9 + length)),
        at: performance.now(),
      };
      this.buffer = this.buffer.subarray(9 + length);
      this.frames.push(f);
      if (f.type === FRAME.SETTINGS && !(f.flags & FLAG.ACK)) this.reply(frame(FRAME.SETTINGS, FLAG.ACK, 0));
      if (f.type === FRAME.PING && !(f.flags & FLAG.ACK)) {
        this.pings++;
        this.owed.push(frame(FRAME.PING, FLAG.ACK, 0, f.payload));
        if (!this.midFrame) this.payOwed();
      }
    }
  }

  private reply(bytes: Buffer): void {
    if (this.midFrame) this.owed.push(bytes);
    else if (!this.closed) this.socket.write(bytes);
  }
}
