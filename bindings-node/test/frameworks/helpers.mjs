// The framework tests run a real model loop (the SDKs' scripted models, no network) against a
// gVisor machine on the `data` image, so that a matplotlib plot is real.
export { withGvisor } from '../helpers.mjs'

/** Two steps that share state (the second uses the first's variable) and draw a plot. */
export const FIRST_CODE = 'total = sum(i * i for i in range(10))\ntotal'
export const SECOND_CODE =
  "import matplotlib.pyplot as plt\nplt.plot([i * i for i in range(10)])\nplt.title('squares')\nprint('doubled')\ntotal * 2"

/** The value a step's text reports: its last line that is a number alone. */
export function lastNumber(text) {
  const value = text.split('\n').filter((line) => /^-?\d+$/.test(line)).at(-1)
  if (value === undefined) throw new Error(`no value in ${JSON.stringify(text)}`)
  return value
}
