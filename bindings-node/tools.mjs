// `evervm/tools` as an ES module: the same classes as `require('evervm/tools')`.
import tools from './tools.cjs'

export const { PythonTool, toolSpec } = tools
export default tools
