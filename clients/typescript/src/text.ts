import type { Message } from "./client.js";

/** A message's content as plain text, as `Message.text` gives it in Python: blocks joined by
 * newlines, an image as its alt text (or "[image]"), any other block as its type in brackets. */
export function messageText(message: Message): string {
  const content = message.content;
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  return content
    .map((block) => {
      if (block.type === "text") return block.text;
      if (block.type === "image") return block.alt || "[image]";
      return `[${String(block.data.type ?? "attachment")}]`;
    })
    .join("\n");
}
