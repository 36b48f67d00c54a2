/** A name-based UUID (RFC 4122 version 5, SHA-1), as Python's `uuid.uuid5` makes it (the
 * name's UTF-8 bytes after the namespace's 16), with Web Crypto: no dependency. */
export async function uuid5(namespace: string, name: string): Promise<string> {
  const hex = namespace.replace(/-/g, "");
  if (!/^[0-9a-f]{32}$/i.test(hex)) throw new TypeError(`not a UUID: ${namespace}`);
  const space = Uint8Array.from(hex.match(/../g) ?? [], (byte) => parseInt(byte, 16));
  // a lone surrogate would be encoded as U+FFFD, and two names would be one (Python refuses)
  if (/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(name)) {
    throw new TypeError("a name with a lone surrogate has no UTF-8 form");
  }
  const encoded = new TextEncoder().encode(name);
  const data = new Uint8Array(space.length + encoded.length);
  data.set(space);
  data.set(encoded, space.length);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-1", data)).slice(0, 16);
  digest[6] = (digest[6]! & 0x0f) | 0x50;
  digest[8] = (digest[8]! & 0x3f) | 0x80;
  const out = Array.from(digest, (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${out.slice(0, 8)}-${out.slice(8, 12)}-${out.slice(12, 16)}-${out.slice(16, 20)}-${out.slice(20)}`;
}
