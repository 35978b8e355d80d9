// A seeded RandomSource (splitmix64) for the SDK's tests: the randomizer's noise comes from a
// fixed stream, so a test's estimates are the same on every run. A device never uses this: its
// noise must come from crypto.getRandomValues, the SDK's default. Shared by the Node script
// (tests/integration/web_sdk_send.mjs) and the browser page (tests/browser/page/main.mjs).
export function seeded(seed) {
    let s = BigInt(seed);
    const M = 0xffffffffffffffffn;
    return {
        fill(bytes) {
            const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
            let i = 0;
            for (; i + 8 <= bytes.length; i += 8) view.setBigUint64(i, next(), true);
            if (i < bytes.length) {
                const last = next();
                for (let j = 0; i < bytes.length; i++, j++) bytes[i] = Number((last >> BigInt(8 * j)) & 0xffn);
            }
        },
    };
    function next() {
        s = (s + 0x9e3779b97f4a7c15n) & M;
        let z = s;
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
        return z ^ (z >> 31n);
    }
}
