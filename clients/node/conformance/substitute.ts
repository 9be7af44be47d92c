/** Replace `{lang}` in every string of a JSON value (scenarios.json's placeholder). */
export function substitute<T>(value: T, lang: string): T {
  if (typeof value === "string") return value.split("{lang}").join(lang) as T;
  if (Array.isArray(value)) return value.map((v) => substitute(v, lang)) as T;
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, lang)])) as T;
  }
  return value;
}
