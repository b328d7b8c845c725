// My account: who I am signed in as, my personal API tokens (for scripts and the CLI): make
// one (shown once), revoke one. In Azure a signed-in scientist makes their own; locally an
// admin makes them (bagpipe tokens create).
import { api, whoami } from "./session.js";
import { age, h } from "./util.js";

export async function accountPage(main) {
  const me = await whoami();
  const list = h("tbody");
  const shown = h("p", { id: "new-token", class: "token", "aria-live": "polite" });
  const label = h("input", { type: "text", id: "token-label", maxlength: 100, placeholder: "what it is for" });
  // the API's rule: an admin makes tokens, a scientist only while signed in with Microsoft (a token makes none)
  const mayMake = me.role === "admin" || me.via === "entra";
  const make = mayMake
    ? h("form", { id: "token-form" }, h("label", { for: "token-label" }, "A new token"), label,
      h("button", { type: "submit", class: "primary" }, "Make a token"), shown)
    : h("p", { id: "token-form", class: "hint" },
      "A token makes no other: sign in with Microsoft to make one, or ask an admin (bagpipe tokens create).");
  main.replaceChildren(h("h1", {}, "My account"),
    h("p", {}, `${me.user} · ${me.email} · ${me.role} · signed in ${me.via === "entra" ? "with Microsoft" : "with a token"}`),
    h("h2", {}, "Personal API tokens"),
    h("p", { class: "hint" }, "For scripts and the command line: bagpipe COMMAND … --key TOKEN, or BAGPIPE_API_KEY=TOKEN " +
      "in the environment (with BAGPIPE_API_URL)."),
    h("table", { class: "tokens" }, h("thead", {}, h("tr", {}, h("th", {}, "Id"), h("th", {}, "Label"),
      h("th", {}, "Made"), h("th", {}, "Last used"), h("th", {}, ""))), list), make);

  async function refresh() {
    const tokens = await api("GET", "/api/tokens");
    list.replaceChildren(...tokens.map((t) => h("tr", { "data-token": t.id }, h("td", {}, h("code", {}, t.id)),
      h("td", {}, t.label), h("td", { title: t.created }, age(t.created)), h("td", {}, t.last_used || "never"),
      h("td", {}, t.revoked ? "revoked" : h("button", { type: "button", class: "danger", onclick: async () => {
        await api("POST", `/api/tokens/${t.id}/revoke`);
        refresh();
      } }, "Revoke")))));
  }

  make.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const made = await api("POST", "/api/tokens", { label: label.value });
      shown.replaceChildren("Copy it now, it is shown only this once: ", h("code", {}, made.token));
      await refresh();
    } catch (err) {
      shown.replaceChildren(h("span", { class: "error" }, err.message));
    }
  });
  await refresh();
}
