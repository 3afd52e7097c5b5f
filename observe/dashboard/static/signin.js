// mdag dashboard sign-in: the page a browser gets (401) for / without a
// valid api token (mdag serve --tokens). The token typed in is kept in
// this tab's sessionStorage, never in the URL; the dashboard is fetched
// with it in an Authorization header and shown in place, and its app.js
// reads the token from sessionStorage for its data requests.
"use strict";
(() => {
  const KEY = "mdag.access_token";
  const form = document.getElementById("signin");
  const input = document.getElementById("token");
  const msg = document.getElementById("signin-msg");

  function say(text) { msg.textContent = text; }

  function stored() {
    try { return sessionStorage.getItem(KEY) || ""; } catch (e) { return ""; }
  }
  function keep(tok) {
    try { if (tok) sessionStorage.setItem(KEY, tok); else sessionStorage.removeItem(KEY); return true; } catch (e) { return false; }
  }

  // show replaces this page with the dashboard's (same CSP: the page's
  // scripts are loaded afresh, as parsed scripts do not run).
  function show(html) {
    const doc = new DOMParser().parseFromString(html, "text/html");
    const scripts = [...doc.querySelectorAll("script[src]")].map((s) => s.getAttribute("src"));
    doc.querySelectorAll("script").forEach((s) => s.remove());
    document.head.replaceWith(document.adoptNode(doc.head));
    document.body.replaceWith(document.adoptNode(doc.body));
    for (const src of scripts) {
      const s = document.createElement("script");
      s.src = src;
      s.async = false;
      document.body.append(s);
    }
  }

  // tryToken asks for the dashboard with tok; true when it is shown.
  async function tryToken(tok) {
    let resp;
    try {
      resp = await fetch("/", { headers: { Authorization: "Bearer " + tok }, cache: "no-store", credentials: "omit" });
    } catch (e) {
      say("the server could not be reached: " + e.message);
      return false;
    }
    if (resp.ok) {
      if (!keep(tok)) {
        say("this browser does not let the page keep the token (sessionStorage); open /?access_token=TOKEN instead");
        return false;
      }
      show(await resp.text());
      return true;
    }
    if (resp.status === 401) {
      keep("");
      say("the server did not accept this token: it needs an api token listed in the server's --tokens file");
    } else {
      say("the server answered " + resp.status + ": " + (await resp.text()).trim());
    }
    return false;
  }

  // A token in the address bar that brought this page was refused: take
  // it out of the URL (and so of the history).
  const url = new URL(location.href);
  if (url.searchParams.has("access_token")) {
    url.searchParams.delete("access_token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const tok = input.value.trim();
    if (!tok) return;
    say("checking the token…");
    tryToken(tok).then((ok) => { if (!ok) input.select(); });
  });

  // A token this tab kept from before (a reload): use it again.
  const tok = stored();
  if (tok) {
    say("opening the dashboard with this tab's token…");
    tryToken(tok).then((ok) => { if (!ok) input.focus(); });
  } else {
    input.focus();
  }
})();
