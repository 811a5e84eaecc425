// swift-tools-version:5.9
// evervm from Swift: a command-line tool using the Evervm package in ../../bindings-swift.
// Build steps: README.md beside this file.
import PackageDescription

let package = Package(
    name: "evervm-swift-example",
    platforms: [.macOS(.v13)],
    dependencies: [
        .package(name: "Evervm", path: "../../bindings-swift"),
    ],
    targets: [
        .executableTarget(
            name: "Quickstart",
            dependencies: [.product(name: "Evervm", package: "Evervm")],
            path: "Sources/Quickstart"
        ),
    ]
)
