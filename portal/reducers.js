// The reducers page: my uploaded reducers with their versions and the jobs that ran each,
// sharing, deleting; those shared with me; the installed ones; and an upload form (a
// folder, or files: reducer.json and the program), sent as multipart form files.
import { api, whoami } from "./session.js";
import { age, bytes, h } from "./util.js";

function versionsTable(owner, name, versions, onDelete) {
  return h("table", { class: "versions", "data-reducer": name }, h("thead", {}, h("tr", {},
    h("th", {}, "Version"), h("th", {}, "Digest"), h("th", {}, "Size"), h("th", {}, "Uploaded"), h("th", {}, "Jobs"),
    onDelete ? h("th", {}, "") : null)),
  h("tbody", {}, ...versions.map((v) => h("tr", { "data-version": v.version },
    h("td", { class: "num" }, String(v.version)), h("td", { title: v.digest }, h("code", {}, v.digest.slice(0, 12))),
    h("td", { class: "num" }, bytes(v.size)), h("td", { title: v.created }, age(v.created)),
    h("td", { class: "jobs-used" }, ...v.jobs.map((j) => h("a", { href: `#/jobs/${j}` }, j, " ")),
      v.other_jobs ? `(+${v.other_jobs} by others)` : (v.jobs.length ? "" : "none")),
    onDelete ? h("td", {}, h("button", { type: "button", class: "danger", onclick: () => onDelete(v.version) },
      "Delete")) : null))));
}

function sharingForm(owner, name, sharing, done) {
  const users = h("input", { type: "text", value: sharing.users.join(", "), "aria-label": `share ${name} with`,
    placeholder: "user names, comma-separated" });
  const everyone = h("input", { type: "checkbox", checked: sharing.everyone, "aria-label": `share ${name} with everyone` });
  const note = h("span", { class: "hint", "aria-live": "polite" });
  return h("form", { class: "sharing", onsubmit: async (event) => {
    event.preventDefault();
    try {
      const found = await api("POST", `/api/reducers/${owner}/${name}/share`,
        { users: users.value.split(/[\s,]+/).filter(Boolean), everyone: everyone.checked });
      note.textContent = `shared with ${found.users.join(", ") || "nobody"}${found.everyone ? " and everyone" : ""}`;
      done();
    } catch (err) {
      note.textContent = err.message;
    }
  } }, "Shared with ", users, h("label", { class: "check" }, everyone, " everyone"),
  h("button", { type: "submit" }, "Save"), note);
}

export async function reducersPage(main) {
  const me = await whoami();
  const folder = h("input", { type: "file", id: "upload-folder", webkitdirectory: true });
  const files = h("input", { type: "file", id: "upload-files", multiple: true });
  const status = h("p", { id: "upload-status", "aria-live": "polite" });
  const form = h("form", { id: "upload-form" }, h("h2", {}, "Upload a reducer"),
    h("p", { class: "hint" }, "reducer.json and the program's files (a compiled C, Fortran or MATLAB binary, a Python " +
      "script). A new version of your reducer of the manifest's name; nothing is stored unless all of it is valid."),
    h("label", { for: "upload-folder" }, "A folder"), folder,
    h("label", { for: "upload-files" }, "or its files"), files,
    h("button", { type: "submit", class: "primary" }, "Upload"), status);
  const mine = h("div", { id: "my-reducers" });
  const shared = h("div", { id: "shared-reducers" });
  const installed = h("ul", { id: "installed-reducers" });
  main.replaceChildren(h("h1", {}, "Reducers"), h("div", { class: "submit-layout" },
    h("div", {}, h("h2", {}, "Mine"), mine, h("h2", {}, "Shared with me"), shared, h("h2", {}, "Installed"), installed),
    form));

  async function refresh() {
    const found = await api("GET", "/api/reducers");
    installed.replaceChildren(...found.installed.map((r) => h("li", {}, h("strong", {}, r.name), ` — ${r.description}`)));
    shared.replaceChildren(...(found.shared.length ? found.shared.map((r) => h("p", {}, h("strong", {}, r.ref),
      ` — ${r.description}`)) : [h("p", {}, "None.")]));
    const shown = await Promise.all(found.mine.map((r) => api("GET", `/api/reducers/${me.user}/${r.name}`)));
    mine.replaceChildren(...(shown.length ? shown.map((r) => h("section", { class: "reducer", "data-name": r.name },
      h("h3", {}, r.name, " ", h("span", { class: "hint" }, r.versions.at(-1).description)),
      versionsTable(r.owner, r.name, r.versions, async (version) => {
        await api("DELETE", `/api/reducers/${r.owner}/${r.name}/${version}`);
        refresh();
      }),
      sharingForm(r.owner, r.name, r.sharing, () => {}))) : [h("p", {}, "None yet: upload one.")]));
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const picked = [...folder.files, ...files.files];
    if (!picked.length) {
      status.textContent = "Pick a folder or files first.";
      return;
    }
    const body = new FormData();
    for (const file of picked) body.append("files", file, file.webkitRelativePath || file.name);
    status.className = "";
    status.textContent = "Uploading…";
    try {
      const made = await api("POST", "/api/reducers", body);
      status.textContent = made.new ? `Uploaded ${made.ref}.` : `Unchanged: still ${made.ref}.`;
      form.reset();
      await refresh();
    } catch (err) {
      status.className = "error";
      status.textContent = err.message;
    }
  });
  await refresh();
}
