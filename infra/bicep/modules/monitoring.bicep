// Log Analytics and Application Insights: the code's OpenTelemetry traces, logs and metrics
// (job, task, attempt and stage on every record) and the Container Apps' console logs.

param prefix string
param suffix string
param location string
param retentionDays int

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${prefix}-logs-${suffix}'
  location: location
  properties: {
    sku: { name: 'PerGB2018' }
    retentionInDays: max(30, retentionDays)
  }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${prefix}-ai-${suffix}'
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
  }
}

output workspaceId string = workspace.id
output workspaceCustomerId string = workspace.properties.customerId
#disable-next-line outputs-should-not-contain-secrets
output workspaceKey string = workspace.listKeys().primarySharedKey
output connectionString string = insights.properties.ConnectionString
