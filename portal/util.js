// Small helpers every page of the portal uses.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function age(iso) {
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 129600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

export function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 10) return `${Number(s.toFixed(1))} s`;
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** An amount in USD as people read it: cents, or four decimals below a cent (a small job). */
export function dollars(usd) {
  return usd >= 0.01 || usd === 0 ? `$${usd.toFixed(2)}` : `$${usd.toFixed(4)}`;
}

export function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

export function stateBadge(state) {
  return h("span", { class: `badge state-${state.toLowerCase()}` }, state);
}

/** Requests of which only the latest's answer counts (a later change has replaced the
 * others): each call marks a new one and returns whether it is still the latest. */
export function latestOnly() {
  let newest = 0;
  return () => {
    const mine = ++newest;
    return () => mine === newest;
  };
}
