/** The one error the device raises: a stable `reason` and a one-line message naming the fix. */
export type DeviceErrorReason = "budget" | "config" | "gateway" | "issuer" | "unauthorized" | "unknown_use_case";

export class DeviceError extends Error {
  constructor(
    readonly reason: DeviceErrorReason,
    message: string,
  ) {
    super(message);
    this.name = "DeviceError";
  }
}
