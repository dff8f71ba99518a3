// Model output is untrusted text. marked turns its markdown into HTML with every piece of raw
// HTML (and every image, which would fetch from elsewhere) turned back into plain text, which
// marked's own renderer escapes; DOMPurify then sanitizes the result (no script, no event
// handler, no javascript: URL) before it reaches the page.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";

const AS_TEXT = new Set(["html", "image"]);

const marked = new Marked({
  gfm: true,
  breaks: true,
  walkTokens(token) {
    if (!AS_TEXT.has(token.type)) return;
    const raw = token.raw;
    const block = token.block === true; // a block of raw HTML: a paragraph of its text
    for (const key of Object.keys(token)) delete token[key];
    const text = { type: "text", raw, text: raw, escaped: false };
    Object.assign(token, block ? { type: "paragraph", raw, text: raw, tokens: [text] } : text);
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = {
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select", "iframe", "svg", "math"],
  FORBID_ATTR: ["style"],
};

// Sanitized HTML for the markdown `text` (a string: give it to innerHTML as is).
export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text || ""), PURIFY);
}
