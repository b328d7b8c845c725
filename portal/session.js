// Signing in, and every call to the API. Locally (and for anyone who has one) a personal
// API token, kept for the browser session only; in Azure also the platform's Entra sign-in
// (App Service Authentication: /.auth/login/aad), whose cookie session the API reads.
const TOKEN = "bagpipe-token";
const methods = fetch("/api/auth").then((r) => r.json()).catch(() => ({}));
let me = null; // who the API says I am, once known

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

function askToken(message, platform) {
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-message").textContent = message;
  const login = document.getElementById("platform-login");
  login.hidden = !platform;
  if (platform) login.href = `${platform.login}?post_login_redirect_uri=${encodeURIComponent(location.pathname + location.hash)}`;
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const token = document.getElementById("key-input").value.trim();
      document.getElementById("key-input").value = "";
      if (token) sessionStorage.setItem(TOKEN, token);
      resolve(token);
    }, { once: true });
  });
}

async function send(method, path, body, token) {
  const headers = { "X-Requested-With": "bagpipe" };
  if (token) headers["X-Bagpipe-Token"] = token;
  const json = body !== undefined && !(body instanceof FormData);
  if (json) headers["content-type"] = "application/json";
  const response = await fetch(path, { method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : json ? JSON.stringify(body) : body });
  const data = response.headers.get("content-type")?.includes("json") ? await response.json() : null;
  return { response, data };
}

// Call the API; sign in first (or again) when it says so.
export async function api(method, path, body) {
  const { platform } = await methods;
  let refreshed = false;
  let message = "";
  for (;;) {
    const token = sessionStorage.getItem(TOKEN);
    const { response, data } = await send(method, path, body, token);
    if (response.status === 401) {
      if (token) {
        sessionStorage.removeItem(TOKEN);
        message = "That token was refused (unknown, revoked or mistyped). Enter a personal API token.";
      } else if (platform && data && data.expired && !refreshed) {
        refreshed = true; // the platform's ID token expired: let it refresh it, then retry
        await fetch(platform.refresh, { credentials: "same-origin" });
        continue;
      }
      me = null;
      if (!(await askToken(message || "Sign in to use bagpipe.", platform))) message = "";
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }
}

export async function whoami() {
  if (!me) me = await api("GET", "/api/me");
  return me;
}

export async function signOut() {
  const { platform } = await methods;
  const hadToken = sessionStorage.getItem(TOKEN);
  sessionStorage.removeItem(TOKEN);
  me = null;
  if (platform && !hadToken) location.href = `${platform.logout}?post_logout_redirect_uri=/portal/`;
}
