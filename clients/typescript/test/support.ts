/** What the tests share: the live server the harness started (tests/typescript/ starts
 * `episodic serve` on PostgreSQL and passes its address and keys), and a TCP proxy that cuts
 * a connection after the server has answered, so the client sees no answer to a request the
 * server did receive. */

import net from "node:net";

import { EpisodicClient, type EpisodicClientOptions } from "../src/index.js";

function required(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through tests/typescript (pytest)`);
  return value;
}

export const BASE_URL = required("EPISODIC_URL");
export const API_KEY = required("EPISODIC_KEY");
export const OPERATOR_KEY = required("EPISODIC_OPERATOR_KEY");

export function client(options: Partial<EpisodicClientOptions> = {}): EpisodicClient {
  return new EpisodicClient({ baseUrl: BASE_URL, apiKey: API_KEY, backoffMs: 10, ...options });
}

export function operator(): EpisodicClient {
  return client({ apiKey: OPERATOR_KEY });
}

/**
 * A proxy to the server that forwards every request and, while `cut` says so for a
 * request's head, reads the server's whole answer and then closes the client's connection
 * without sending it: the server did the work, the client saw nothing.
 */
export class CuttingProxy {
  readonly #server: net.Server;
  /** request heads seen (method and path) */
  readonly seen: string[] = [];
  /** requests whose answer was withheld */
  cutCount = 0;

  constructor(private readonly cut: (head: string, index: number) => boolean) {
    const target = new URL(BASE_URL);
    this.#server = net.createServer((downstream) => {
      // One request per connection: the proxy asks the server to close after it answers.
      let request = Buffer.alloc(0);
      let forwarded = false;
      downstream.on("data", (chunk: Buffer) => {
        request = Buffer.concat([request, chunk]);
        if (forwarded || !complete(request)) return;
        forwarded = true;
        const head = request.subarray(0, request.indexOf("\r\n")).toString("latin1");
        const index = this.seen.push(head) - 1;
        const withhold = this.cut(head, index);
        const upstream = net.connect(Number(target.port), target.hostname);
        upstream.write(closeAfter(request));
        const answer: Buffer[] = [];
        upstream.on("data", (part: Buffer) => {
          if (withhold) answer.push(part);
          else downstream.write(part);
        });
        upstream.on("end", () => {
          if (withhold) {
            this.cutCount++;
            downstream.destroy();
          } else {
            downstream.end();
          }
        });
        upstream.on("error", () => downstream.destroy());
      });
      downstream.on("error", () => undefined);
    });
  }

  async start(): Promise<string> {
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    const address = this.#server.address() as net.AddressInfo;
    return `http://127.0.0.1:${address.port}`;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/** The request's head and, by its Content-Length, its whole body have arrived. */
function complete(request: Buffer): boolean {
  const end = request.indexOf("\r\n\r\n");
  if (end < 0) return false;
  const head = request.subarray(0, end).toString("latin1");
  const length = /\r\ncontent-length:\s*(\d+)/i.exec(head);
  return request.length >= end + 4 + (length ? Number(length[1]) : 0);
}

/** The request with `Connection: close`, so the server ends the connection after answering. */
function closeAfter(request: Buffer): Buffer {
  const end = request.indexOf("\r\n\r\n");
  const head = request
    .subarray(0, end)
    .toString("latin1")
    .split("\r\n")
    .filter((line) => !/^connection:/i.test(line));
  head.push("Connection: close");
  return Buffer.concat([Buffer.from(head.join("\r\n") + "\r\n\r\n", "latin1"), request.subarray(end + 4)]);
}

export function userMessage(text: string): { role: "user"; content: string } {
  return { role: "user", content: text };
}

/** Wait (up to `seconds`) until the worker has written a boundary newer than `seen` (a
 * boundary's seq, or null for none yet), and return its seq. */
export async function waitForBoundary(
  c: EpisodicClient,
  conversationId: string,
  seen: number | null,
  seconds = 60,
): Promise<number> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const head = await c.getConversation(conversationId);
    const latest = head.conversation.boundary_seq;
    if (latest !== null && latest !== seen) return latest;
    if (Date.now() > deadline) {
      throw new Error(`no boundary from the worker in ${seconds} s: ${JSON.stringify(head.conversation)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}
