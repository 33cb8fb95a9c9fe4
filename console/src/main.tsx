/**
 * The operator console: a read-only view of sessions, watchers, notices and the service's
 * live state, built on the service's own RPCs (docs/console.md). Routes live in the URL's
 * hash: #/ (the session tree), #/session?agent=…&key=… (one session), #/live.
 */
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { Code, ConnectError } from "@connectrpc/connect";
import type { WhoAmIResponse } from "../../gen/sessionstate/v1/admin_pb.js";
import { api, storedToken, storeToken } from "./api.js";
import { errorText } from "./format.js";
import { live, type LiveStatus } from "./live.js";
import { TokenForm } from "./views/TokenForm.js";
import { Tree } from "./views/Tree.js";
import { SessionPage } from "./views/SessionPage.js";
import { LivePage } from "./views/LivePage.js";

type Route = { page: "tree" } | { page: "session"; agentId: string; sessionKey: string } | { page: "live" };

function parseRoute(hash: string): Route {
  const [path, query = ""] = hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query);
  if (path === "/session" && params.get("key")) return { page: "session", agentId: params.get("agent") ?? "", sessionKey: params.get("key")! };
  if (path === "/live") return { page: "live" };
  return { page: "tree" };
}

function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const onChange = () => setRoute(parseRoute(location.hash));
    addEventListener("hashchange", onChange);
    return () => removeEventListener("hashchange", onChange);
  }, []);
  return route;
}

function App() {
  const route = useRoute();
  const [who, setWho] = useState<WhoAmIResponse>();
  const [needToken, setNeedToken] = useState<string>();
  const [fatal, setFatal] = useState<string>();
  const [status, setStatus] = useState<LiveStatus>(live.status);
  const [attempt, setAttempt] = useState(0);

  useEffect(() => live.listen({ status: setStatus }), []);
  useEffect(() => {
    let stale = false;
    api.admin
      .whoAmI({})
      .then((me) => {
        if (stale) return;
        setWho(me);
        setNeedToken(undefined);
        live.start(me.agentIds);
      })
      .catch((err) => {
        if (stale) return;
        const e = ConnectError.from(err);
        if (e.code === Code.Unauthenticated || e.code === Code.PermissionDenied) setNeedToken(storedToken() === "" ? "" : errorText(err));
        else setFatal(errorText(err));
      });
    return () => {
      stale = true;
    };
  }, [attempt]);

  const signIn = (token: string) => {
    storeToken(token);
    setAttempt((n) => n + 1);
  };
  const signOut = () => {
    live.stop();
    storeToken("");
    setWho(undefined);
    setNeedToken("");
  };

  if (needToken !== undefined) return <TokenForm error={needToken} onToken={signIn} />;
  if (fatal) return <p class="error">The service did not answer: {fatal}</p>;
  if (!who) return <p class="muted">Connecting…</p>;
  const scope = who.agentIds;
  return (
    <>
      <header>
        <strong>sessionstate</strong>
        <nav>
          <a href="#/" class={route.page === "tree" ? "active" : ""}>Sessions</a>
          <a href="#/live" class={route.page === "live" ? "active" : ""}>Live</a>
        </nav>
        <span class="who" data-testid="who">
          {who.authenticated ? `${who.tokenName} (${who.role}${scope.length > 0 ? `, agents ${scope.join(", ")}` : ""})` : "no authentication (loopback)"} · {who.backend} · {who.replica}
        </span>
        <span class={status.connected ? "live on" : "live off"} title={status.error ?? ""} data-testid="live-status">
          {status.connected ? "live" : status.error ? "live: stopped" : "live: connecting"}
        </span>
        {who.authenticated && (
          <button type="button" onClick={signOut}>
            Forget token
          </button>
        )}
      </header>
      <main>
        {route.page === "tree" && <Tree scope={scope} />}
        {route.page === "session" && <SessionPage key={`${route.agentId}\u0000${route.sessionKey}`} agentId={route.agentId} sessionKey={route.sessionKey} />}
        {route.page === "live" && <LivePage scope={scope} />}
      </main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
