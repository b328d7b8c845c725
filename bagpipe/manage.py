"""``bagpipe users|tokens|addresses|reducers|audit|jobs|whoami``: the CLI of accounts, the
addresses jobs may mail and uploaded reducers, through the API like every other command."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from bagpipe.client import DEFAULT_HOME, Api, ApiError, ApiUnreachable
from bagpipe.terminal import console, fail

users = typer.Typer(help="Users (admin).", no_args_is_help=True, rich_markup_mode=None)
tokens = typer.Typer(help="Personal API tokens.", no_args_is_help=True, rich_markup_mode=None)
reducers = typer.Typer(help="Reducers you upload, share and run.", no_args_is_help=True, rich_markup_mode=None)
addresses = typer.Typer(help="Addresses your jobs may mail when they finish.", no_args_is_help=True,
                        rich_markup_mode=None)

HomeOpt = Annotated[Path, typer.Option(help="Folder of the local stack's state.")]
ApiOpt = Annotated[Optional[str], typer.Option("--api", help="API base URL.")]
KeyOpt = Annotated[Optional[str], typer.Option("--key", help="Personal API token.")]
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="Their user name.")]
SKIPPED = {"__pycache__", ".git"}


def _api(api: str | None, key: str | None, home: Path) -> Api:
    try:
        return Api.resolve(api, key, home)
    except RuntimeError as exc:
        fail(exc)


def _run(call: Any) -> Any:
    try:
        return call()
    except (ApiError, ApiUnreachable) as exc:
        fail(exc)


def _table(title: str, rows: list[dict[str, Any]], columns: list[str], whole: str = "") -> None:
    """A table of ``rows``; the column ``whole`` (an id to copy) never cut, whatever the
    terminal's width."""
    table = Table(title=title)
    for column in columns:
        if column == whole:
            table.add_column(column, no_wrap=True, min_width=max((len(str(row.get(column, ""))) for row in rows),
                                                                 default=0))
        else:
            table.add_column(column)
    for row in rows:
        table.add_row(*(str(row.get(c, "")) for c in columns))
    console.print(table)


@users.command("add")
def users_add(name: NameArg, email: Annotated[str, typer.Option(help="Their e-mail (their Entra sign-in in Azure).")],
              admin: Annotated[bool, typer.Option("--admin", help="An admin, not a scientist.")] = False,
              api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Add a user (then: bagpipe tokens create --user NAME)."""
    body = {"name": name, "email": email, "role": "admin" if admin else "scientist"}
    added = _run(lambda: _api(api, key, home).post("/api/users", body))
    console.print(f"added {added['user']} ({added['role']}, {added['email']})")


@users.command("bootstrap")
def users_bootstrap(name: NameArg, email: Annotated[str, typer.Option(help="Their e-mail.")]) -> None:
    """Make an admin and a token of theirs straight in storage (settings from the environment:
    BagpipeStorage, or BagpipeStorage__accountName and an Azure sign-in with table data
    access): the first admin of a deployment that has no Entra sign-in."""
    from pipeline.settings import Settings
    from pipeline.storage.clients import clients_for
    from pipeline.web import identity

    try:
        clients = clients_for(Settings.from_env())
        user = identity.get_user(clients, name) or identity.add_user(clients, name, email, "admin", by="bootstrap")
    except (ValueError, identity.IdentityError) as exc:
        fail(exc)
    if not user.admin:
        fail(ValueError(f"{name} is not an admin"))
    console.print(f"token for admin {name} (shown once, never again):", style="bold")
    print(identity.create_token(clients, user, "bootstrap", by="bootstrap")[0])


@users.command("list")
def users_list(api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Every user."""
    _table("users", _run(lambda: _api(api, key, home).get("/api/users")), ["user", "role", "email"])


@tokens.command("create")
def tokens_create(user: Annotated[Optional[str], typer.Option(help="Whose (admin); default: mine.")] = None,
                  label: Annotated[str, typer.Option(help="What it is for.")] = "",
                  api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Make a personal API token. It is printed once: keep it (e.g. as BAGPIPE_API_KEY)."""
    made = _run(lambda: _api(api, key, home).post("/api/tokens", {"user": user, "label": label}))
    console.print(f"token {made['id']} for {made['user']} (shown once, never again):", style="bold")
    print(made["token"])


@tokens.command("list")
def tokens_list(user: Annotated[Optional[str], typer.Option(help="Whose (admin); default: mine.")] = None,
                api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """The tokens of a user (ids, labels, last use; never the secrets)."""
    found = _run(lambda: _api(api, key, home).get("/api/tokens", user=user))
    _table("tokens", found, ["id", "user", "label", "created", "last_used", "revoked"])


@tokens.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID", help="As tokens list shows it.")],
                  api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Revoke a token: refused from the next request on."""
    _run(lambda: _api(api, key, home).post(f"/api/tokens/{token_id}/revoke"))
    console.print(f"token {token_id} revoked")


@addresses.command("add")
def addresses_add(address: Annotated[str, typer.Argument(metavar="ADDRESS", help="An e-mail address.")],
                  user: Annotated[Optional[str], typer.Option(help="Whose (admin: allowed at once).")] = None,
                  api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Ask that your jobs may mail ADDRESS: it gets a link to open (an admin's is allowed at once)."""
    found = _run(lambda: _api(api, key, home).post("/api/addresses", {"address": address, "user": user}))
    console.print(f"{found['address']}: {'confirmed' if found['confirmed'] else found['detail']}")


@addresses.command("list")
def addresses_list(api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """The addresses your jobs may mail, and those waiting for their confirmation."""
    _table("addresses", _run(lambda: _api(api, key, home).get("/api/addresses")), ["address", "confirmed", "since"])


def pack(folder: Path) -> bytes:
    """A folder as a tar.gz, its files' modes kept (links too: the API refuses them, by name)."""
    if not (folder / "reducer.json").is_file():
        raise ValueError(f"{folder} has no reducer.json")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if SKIPPED & set(relative.parts) or (path.is_dir() and not path.is_symlink()):
                continue
            tar.add(path, arcname=relative.as_posix(), recursive=False)
    return raw.getvalue()


def _split(ref: str, api: Api) -> tuple[str, str]:
    """``owner/name`` or ``name`` (mine) → (owner, name)."""
    if "/" in ref:
        owner, name = ref.split("/", 1)
        return owner, name
    return _run(lambda: api.get("/api/me"))["user"], ref


@reducers.command("push")
def reducers_push(folder: Annotated[Path, typer.Argument(metavar="FOLDER", help="reducer.json and its program.")],
                  api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Upload the reducer in FOLDER (reducer.json and its program) as its next version."""
    try:
        archive = pack(folder)
    except (OSError, ValueError) as exc:
        fail(exc)
    made = _run(lambda: _api(api, key, home).push(archive))
    what = "new version" if made["new"] else "unchanged: still"
    console.print(f"{what} {made['ref']} ({made['files']} files, {made['size']} bytes, sha256 {made['digest'][:12]})")
    print(made["ref"])


@reducers.command("list")
def reducers_list(api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """The reducers you may run: installed, yours, shared with you."""
    found = _run(lambda: _api(api, key, home).get("/api/reducers"))
    _table("installed", found["installed"], ["name", "description"])
    _table("mine", found["mine"], ["name", "version", "created", "description"])
    _table("shared with me", found["shared"], ["ref", "created", "description"])


@reducers.command("show")
def reducers_show(ref: Annotated[str, typer.Argument(metavar="REDUCER", help="NAME (mine) or OWNER/NAME.")],
                  as_json: Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")] = False,
                  api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """A reducer's versions and the jobs that ran each."""
    client = _api(api, key, home)
    owner, name = _split(ref, client)
    found = _run(lambda: client.get(f"/api/reducers/{owner}/{name}"))
    if as_json:
        print(json.dumps(found, indent=1))
        return
    rows = [v | {"jobs": ", ".join(v["jobs"]) + (f" (+{v['other_jobs']} of others)" if v["other_jobs"] else "")}
            for v in found["versions"]]
    _table(f"{owner}/{name}", rows, ["version", "digest", "size", "created", "jobs"])
    if found.get("sharing"):
        console.print(f"shared with: {', '.join(found['sharing']['users']) or 'nobody'}"
                      f"{'; everyone' if found['sharing']['everyone'] else ''}")


@reducers.command("share")
def reducers_share(ref: Annotated[str, typer.Argument(metavar="REDUCER", help="NAME (mine) or OWNER/NAME (admin).")],
                   with_: Annotated[Optional[list[str]], typer.Option("--with", help="A user (repeat).")] = None,
                   everyone: Annotated[bool, typer.Option("--everyone", help="Every user.")] = False,
                   private: Annotated[bool, typer.Option("--private", help="Nobody but me.")] = False,
                   api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Share a reducer (every version) with users or everyone, added to whom it is shared
    with already; --private takes it back from all."""
    client = _api(api, key, home)
    owner, name = _split(ref, client)
    body: dict[str, Any] = {"users": [], "everyone": False}
    if not private:
        current = _run(lambda: client.get(f"/api/reducers/{owner}/{name}"))["sharing"] or body
        body = {"users": sorted(set(current["users"]) | set(with_ or [])), "everyone": everyone or current["everyone"]}
    found = _run(lambda: client.post(f"/api/reducers/{owner}/{name}/share", body))
    console.print(f"{owner}/{name}: shared with {', '.join(found['users']) or 'nobody'}"
                  f"{'; everyone' if found['everyone'] else ''}")


@reducers.command("delete")
def reducers_delete(ref: Annotated[str, typer.Argument(metavar="REDUCER",
                                                      help="NAME[@VERSION] or OWNER/NAME[@VERSION].")],
                    api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Delete a version, or every version: no new job may name it."""
    client = _api(api, key, home)
    base, _, version = ref.partition("@")
    owner, name = _split(base, client)
    path = f"/api/reducers/{owner}/{name}" + (f"/{version}" if version else "")
    found = _run(lambda: client.delete(path))
    console.print(f"deleted {owner}/{name} version(s) {', '.join(map(str, found['deleted']))}")


def register(app: typer.Typer) -> None:
    """Add these commands to the ``bagpipe`` CLI."""
    app.add_typer(users, name="users")
    app.add_typer(tokens, name="tokens")
    app.add_typer(addresses, name="addresses")
    app.add_typer(reducers, name="reducers")

    @app.command()
    def whoami(api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
        """The user your token signs in."""
        me = _run(lambda: _api(api, key, home).get("/api/me"))
        console.print(f"{me['user']} ({me['role']}, {me['email']}) via {me['via']}")

    @app.command("jobs")
    def jobs_list(all_: Annotated[bool, typer.Option("--all", help="Everyone's (admin).")] = False,
                  limit: int = 50, api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
        """Your jobs, newest first."""
        found = _run(lambda: _api(api, key, home).get("/api/jobs", limit=limit, all="true" if all_ else None))
        _table("jobs", found, ["job", "owner", "state", "total", "created", "label"], whole="job")

    @app.command()
    def audit(day: Annotated[Optional[str], typer.Option(help="YYYY-MM-DD (UTC); default today.")] = None,
              user: Annotated[str, typer.Option(help="Only this user's events.")] = "",
              api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
        """A day's audit trail (admin)."""
        found = _run(lambda: _api(api, key, home).get("/api/audit", day=day, user=user))
        _table(f"audit {day or 'today'}", found, ["at", "who", "what", "target", "detail"])
