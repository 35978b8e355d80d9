// The page's device: reads what to send from params.json (written by the test), sends it with
// the SDK as an application would, and leaves the outcome in window.ldpipeResult (the driver,
// tests/browser/drive.mjs, waits for it). Only the seeded randomizer is a test's choice.
import { DeviceError, WebDevice } from "./ldpipe.js";
import { seeded } from "./seeded.mjs";

async function run() {
    const params = await (await fetch("./params.json", { cache: "no-store" })).json();
    const started = performance.now();
    const device = new WebDevice({
        gatewayUrl: params.gateway,
        useCase: params.use_case,
        credential: params.credential,
        rng: seeded(params.seed),
    });
    const config = await device.configuration();
    const result = await device.send(params.items);
    return {
        accepted: result.accepted,
        refused: result.refused,
        held: result.held.length,
        undelivered: result.undelivered,
        seed: config.hashSeed.toString(),
        origin: location.origin,
        secure: window.isSecureContext,
        subtle: typeof crypto.subtle?.importKey === "function",
        user_agent: navigator.userAgent,
        seconds: (performance.now() - started) / 1000,
    };
}

run().then(
    (result) => {
        document.getElementById("status").textContent = `accepted ${result.accepted}`;
        window.ldpipeResult = result;
    },
    (err) => {
        const reason = err instanceof DeviceError ? err.reason : err?.name ?? "Error";
        window.ldpipeResult = { error: `${reason}: ${err?.message ?? String(err)}` };
    },
);
