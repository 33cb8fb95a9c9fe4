/** Asks for a bearer token once; it is kept for this tab only (sessionStorage). */
import { useState } from "preact/hooks";

export function TokenForm(props: { error: string; onToken(token: string): void }) {
  const [token, setToken] = useState("");
  return (
    <form
      class="token"
      onSubmit={(e) => {
        e.preventDefault();
        props.onToken(token.trim());
      }}
    >
      <h1>sessionstate console</h1>
      <p>
        This server needs a bearer token. A <code>reader</code> token is enough (
        <code>sessionstate token create --name dashboard --role reader</code>). It is kept in this tab only and sent as{" "}
        <code>Authorization: Bearer …</code> with every call.
      </p>
      {props.error && <p class="error" data-testid="token-error">{props.error}</p>}
      <label>
        Token <input type="password" name="token" autocomplete="off" value={token} onInput={(e) => setToken(e.currentTarget.value)} />
      </label>
      <button type="submit">Open</button>
    </form>
  );
}
