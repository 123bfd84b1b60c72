// Drives `hako mcp` over stdio with the official TypeScript MCP SDK
// (npm `@modelcontextprotocol/sdk`), a client hako did not write, used as
// it ships: its `Client` and `StdioClientTransport`.
//
// Usage: node mcp_ts_client.mjs SDK_DIR HAKO BACKEND WORKSPACE
//
// SDK_DIR is the directory whose node_modules holds the SDK (the test
// command installs it there). Exits 0 when every check passed, 1 (with the
// failed check) otherwise, and 2 when the SDK cannot be loaded.

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [sdkDir, hako, backend, ws] = process.argv.slice(2);
if (!sdkDir || !hako || !backend || !ws) {
  console.error("usage: node mcp_ts_client.mjs SDK_DIR HAKO BACKEND WORKSPACE");
  process.exit(1);
}

async function load(sub) {
  const file = path.join(sdkDir, "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm", sub);
  return import(pathToFileURL(file).href);
}

let Client, StdioClientTransport;
try {
  ({ Client } = await load("client/index.js"));
  ({ StdioClientTransport } = await load("client/stdio.js"));
} catch (e) {
  console.log(`SKIP: the TypeScript MCP SDK cannot be loaded from ${sdkDir} (${e.message})`);
  process.exit(2);
}

class Failed extends Error {}

function check(cond, what, detail = "") {
  if (!cond) {
    throw new Failed(`${what}\n--- got ---\n${typeof detail === "string" ? detail : JSON.stringify(detail, null, 2)}`);
  }
  console.log(`ok: ${what}`);
}

function textOf(result) {
  return (result.content ?? []).map((c) => (c.type === "text" ? c.text : "")).join("");
}

async function call(client, name, args) {
  const result = await client.callTool({ name, arguments: args });
  return [Boolean(result.isError), textOf(result)];
}

async function expectOk(client, name, args, what) {
  const [err, text] = await call(client, name, args);
  check(!err, `${what} (${name} succeeds)`, text);
  return text;
}

async function expectError(client, name, args, what) {
  const [err, text] = await call(client, name, args);
  check(err, `${what} (${name} is a tool error)`, text);
  return text;
}

const env = {};
for (const [k, v] of Object.entries(process.env)) {
  if (k.startsWith("HAKO_") || k === "PATH") env[k] = v;
}
const transport = new StdioClientTransport({
  command: hako,
  // As the README's setup lines start it: never on the host backend.
  args: ["mcp", "--backend", backend, "--min-isolation", "process", "--workspace", ws],
  env,
  stderr: "inherit",
});
const client = new Client({ name: "hako-ts-test", version: "1.0.0" });

try {
  await client.connect(transport);
  const info = client.getServerVersion();
  check(info?.name === "hako", "the server says it is hako", info);
  check(client.getServerCapabilities()?.tools !== undefined, "the server offers tools", client.getServerCapabilities());

  const { tools } = await client.listTools();
  const names = new Set(tools.map((t) => t.name));
  for (const want of ["read_file", "write_file", "edit_file", "list_dir", "run_command"]) {
    check(names.has(want), `the tool list has ${want}`, [...names]);
  }
  for (const tool of tools) {
    check(tool.inputSchema?.type === "object", `${tool.name} has an object input schema`, tool.inputSchema);
    check((tool.description ?? "").length > 80, `${tool.name} has a description`, tool.description);
  }
  const readFile = tools.find((t) => t.name === "read_file");
  check(JSON.stringify(readFile.inputSchema.required) === '["path"]', "read_file requires only path", readFile.inputSchema);

  // A file round trip, into a directory that does not exist yet.
  const body = "from typescript\nsecond line\n";
  let text = await expectOk(client, "write_file", { path: "ts/hello.txt", content: body }, "write a file");
  check(text.includes(`wrote ${Buffer.byteLength(body)} bytes`), "write_file says what it wrote", text);
  check(fs.readFileSync(path.join(ws, "ts/hello.txt"), "utf8") === body, "the file is on disk");
  text = await expectOk(client, "read_file", { path: "ts/hello.txt" }, "read it back");
  check(text === "     1\tfrom typescript\n     2\tsecond line\n", "read_file gives the content, numbered", text);

  // A command, which sees the file and reports its exit code and streams.
  text = await expectOk(client, "run_command", { command: "cat ts/hello.txt; echo oops >&2; exit 4" }, "run a command");
  check(text.includes("exit code: 4"), "the exit code is reported", text);
  check(text.includes("from typescript") && text.includes("oops"), "both streams are reported", text);
  text = await expectOk(client, "run_command", { command: "pwd", cwd: "ts" }, "run a command in a subdirectory");
  check(text.trimEnd().endsWith("/ts"), "cwd applies", text);

  // A refused path is a tool error (not a protocol error) that says why,
  // and nothing is written outside.
  const outside = path.join(path.dirname(ws), "ts-outside-target");
  for (const bad of ["../x", "/etc/passwd", "ts/../../x"]) {
    text = await expectError(client, "read_file", { path: bad }, `read ${bad}`);
    check(text.includes("refused") && text.includes("workspace"), `reading ${bad} is refused with the reason`, text);
  }
  text = await expectError(client, "write_file", { path: "../ts-outside-target", content: "x" }, "write outside");
  check(text.includes("refused"), "writing outside is refused with the reason", text);
  check(!fs.existsSync(outside), "nothing was written outside", text);

  // The server is still usable after the refusals.
  text = await expectOk(client, "run_command", { command: "echo still here" }, "a command after the refusals");
  check(text.includes("still here"), "the server still runs commands", text);
  text = await expectOk(client, "read_file", { path: "ts/hello.txt" }, "a read after the refusals");
  check(text.includes("from typescript"), "the server still reads files", text);

  // An unknown tool is an error too, and the server goes on.
  let threw = false;
  try {
    const r = await client.callTool({ name: "no_such_tool", arguments: {} });
    threw = Boolean(r.isError);
  } catch {
    threw = true;
  }
  check(threw, "an unknown tool is refused");
  text = await expectOk(client, "list_dir", { path: "ts" }, "list a directory after it");
  check(text.includes("hello.txt"), "list_dir shows the file", text);

  await client.close();
  console.log("all checks passed");
  process.exit(0);
} catch (e) {
  console.log(`FAILED: ${e instanceof Failed ? e.message : e.stack ?? e}`);
  try {
    await client.close();
  } catch {}
  process.exit(1);
}
