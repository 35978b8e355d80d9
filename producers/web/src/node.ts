/**
 * The SDK for Node 20 (dist/ldpipe-node.mjs): everything of the browser bundle, plus the budget
 * ledger's file storage (docs/device-web.md "The budget").
 */
import { closeSync, fsyncSync, openSync } from "node:fs";
import { chmod, mkdir, open, readFile, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import type { BudgetStorage } from "./budget.js";

export * from "./index.js";

/**
 * The budget ledger in a JSON file (mode 0600, its directory made if missing), written
 * atomically as the Python library writes it: a temporary file in the same directory, fsync,
 * rename over the ledger (POSIX rename(2)), fsync of the directory.
 */
export class FileBudgetStorage implements BudgetStorage {
  constructor(readonly path: string) {}

  get name(): string {
    return this.path;
  }

  async load(): Promise<string | null> {
    try {
      return await readFile(this.path, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw err;
    }
  }

  async save(text: string): Promise<void> {
    const directory = dirname(this.path);
    await mkdir(directory, { recursive: true });
    const tmp = join(directory, `.${basename(this.path)}.${process.pid}.${Math.random().toString(36).slice(2)}`);
    try {
      const handle = await open(tmp, "wx", 0o600);
      try {
        await handle.writeFile(text, "utf8");
        await handle.sync();
      } finally {
        await handle.close();
      }
      await chmod(tmp, 0o600);
      await rename(tmp, this.path);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    const fd = openSync(directory, "r");
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
}
