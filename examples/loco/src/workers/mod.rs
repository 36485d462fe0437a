pub mod downloader;

pub mod report;
