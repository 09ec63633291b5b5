// The chat page's Markdown renderer and code highlighter: the subset models write (headings,
// paragraphs, emphasis, inline code, fenced code, lists, quotes, tables, links, rules), turned
// into HTML in which every piece of the model's text is escaped first. It runs on every streamed
// delta, so an unfinished construct (an open code fence) renders as far as it has arrived.
"use strict";

window.Markdown = (() => {
  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escapeHtml = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);

  // Words most languages reserve; enough to make code readable without a grammar per language.
  const KEYWORDS = new Set((
    "as async await break case catch class const continue def default del do elif else enum " +
    "export extends false fn for from func function if impl import in interface let loop match " +
    "mod module mut new nil None null package pass pub raise return self Self static struct " +
    "super switch this throw trait true True False try type typeof use var void where while " +
    "with yield int float double char bool string str long unsigned signed include define"
  ).split(" "));

  // One pass over the code: comments, strings, numbers and words, each matched where it starts.
  const TOKENS = new RegExp([
    String.raw`(\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$)|#(?![!\[])[^\n]*|--[^\n]*)`,
    String.raw`("(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|\x60(?:[^\x60\\]|\\.)*\x60?)`,
    String.raw`(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b|\b0x[\da-f]+\b)`,
    String.raw`([A-Za-z_][\w]*)`,
  ].join("|"), "gi");

  // Languages whose `#` starts a preprocessor line or a selector, not a comment.
  const HASH_IS_CODE = new Set(["c", "cpp", "c++", "h", "css", "scss", "rust", "rs", "cs", "csharp", "objc"]);
  const DASHES_COMMENT = new Set(["sql", "lua", "haskell", "hs"]);

  function highlight(code, language) {
    const lang = (language || "").toLowerCase();
    let out = "";
    let last = 0;
    for (const match of code.matchAll(TOKENS)) {
      const [text, comment, string, number, word] = match;
      let kind = null;
      if (comment) {
        const hash = comment.startsWith("#");
        const dashes = comment.startsWith("--");
        if ((hash && HASH_IS_CODE.has(lang)) || (dashes && !DASHES_COMMENT.has(lang))) continue;
        kind = "comment";
      } else if (string) kind = "string";
      else if (number) kind = "number";
      else if (word && KEYWORDS.has(word)) kind = "keyword";
      else if (word && code[match.index + text.length] === "(") kind = "function";
      if (!kind) continue;
      out += escapeHtml(code.slice(last, match.index));
      out += `<span class="tok-${kind}">${escapeHtml(text)}</span>`;
      last = match.index + text.length;
    }
    return out + escapeHtml(code.slice(last));
  }

  function safeUrl(url) {
    return /^(https?:|mailto:)/i.test(url) ? url : null;
  }

  // Inline code is cut out first so that nothing inside it is read as emphasis or a link.
  function inline(text) {
    const spans = [];
    const held = text.replace(/(`+)([\s\S]*?[^`])\1(?!`)/g, (_, __, code) => {
      spans.push(`<code>${escapeHtml(code.trim())}</code>`);
      return `\u0000${spans.length - 1}\u0000`;
    });
    let html = escapeHtml(held)
      .replace(/\[([^\]]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
        const href = safeUrl(url.replace(/&amp;/g, "&"));
        return href ? `<a href="${escapeHtml(href)}" target="_blank" rel="noopener">${label}</a>` : whole;
      })
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?!\*)/g, "$1<em>$2</em>")
      .replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?!\w)/g, "$1<em>$2</em>")
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, "<del>$1</del>");
    return html.replace(/\u0000(\d+)\u0000/g, (_, i) => spans[Number(i)]);
  }

  function codeBlock(code, language) {
    const label = escapeHtml(language || "text");
    return `<div class="code"><div class="code-head"><span>${label}</span>` +
      `<button type="button" class="copy" data-copy="code">Copy</button></div>` +
      `<pre><code>${highlight(code, language)}</code></pre></div>`;
  }

  const LIST_ITEM = /^(\s*)([-*+]|\d+[.)])\s+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

  function cells(line) {
    return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => inline(c.trim()));
  }

  // Consecutive list items; a deeper indent opens a list inside the item above.
  function list(lines) {
    const parse = (line) => {
      const [, space, marker, text] = LIST_ITEM.exec(line);
      return { indent: space.length, ordered: /\d/.test(marker), text };
    };
    const first = parse(lines[0]);
    const root = { ordered: first.ordered, indent: first.indent, items: [] };
    const stack = [root];
    for (const line of lines) {
      const item = parse(line);
      while (stack.length > 1 && item.indent < stack[stack.length - 1].indent) stack.pop();
      let top = stack[stack.length - 1];
      if (item.indent > top.indent && top.items.length) {
        const child = { ordered: item.ordered, indent: item.indent, items: [] };
        top.items[top.items.length - 1].children = child;
        stack.push(child);
        top = child;
      }
      top.items.push({ text: item.text });
    }
    const render = (node) => {
      const tag = node.ordered ? "ol" : "ul";
      const items = node.items.map((item) =>
        `<li>${inline(item.text)}${item.children ? render(item.children) : ""}</li>`);
      return `<${tag}>${items.join("")}</${tag}>`;
    };
    return render(root);
  }

  function render(text) {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/.exec(line);
      if (fence) {
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i += 1;
        out.push(codeBlock(body.join("\n"), fence[2]));
        continue;
      }
      const heading = /^(#{1,6})\s+(.*)$/.exec(line);
      if (heading) {
        const level = heading[1].length;
        out.push(`<h${level}>${inline(heading[2].replace(/\s#+\s*$/, ""))}</h${level}>`);
        i += 1;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        out.push("<hr>");
        i += 1;
        continue;
      }
      if (/^\s*>/.test(line)) {
        const quoted = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
        out.push(`<blockquote>${render(quoted.join("\n"))}</blockquote>`);
        continue;
      }
      if (LIST_ITEM.test(line)) {
        const items = [];
        while (i < lines.length && LIST_ITEM.test(lines[i])) items.push(lines[i++]);
        out.push(list(items));
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
        const head = cells(line).map((c) => `<th>${c}</th>`).join("");
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          rows.push(`<tr>${cells(lines[i++]).map((c) => `<td>${c}</td>`).join("")}</tr>`);
        }
        out.push(`<div class="table"><table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table></div>`);
        continue;
      }
      if (!line.trim()) {
        i += 1;
        continue;
      }
      const paragraph = [];
      while (i < lines.length && lines[i].trim() && !/^\s*(`{3,}|~{3,}|#{1,6}\s|>)/.test(lines[i]) &&
        !LIST_ITEM.test(lines[i])) {
        paragraph.push(lines[i++]);
      }
      out.push(`<p>${paragraph.map(inline).join("<br>")}</p>`);
    }
    return out.join("");
  }

  return { render };
})();
