// The Function App (Python 3.11, Linux, Flex Consumption): the API and portal, the planner
// and completion queue triggers, the monitor orchestration. host.json tunes the triggers.

param prefix string
param suffix string
param location string
param storageName string
param blobEndpoint string
@description('The app settings the code reads (names.json keys → values), shared with the workers.')
param settings object
@description('Most Function App instances at once.')
param maxInstances int

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: '${prefix}-plan-${suffix}'
  location: location
  kind: 'functionapp'
  sku: { tier: 'FlexConsumption', name: 'FC1' }
  properties: { reserved: true }
}

var hostSettings = [
  // the Functions host's own storage (Durable task hub, triggers' bookkeeping), by identity
  { name: 'AzureWebJobsStorage__accountName', value: storageName }
]

resource app 'Microsoft.Web/sites@2024-04-01' = {
  name: '${prefix}-fn-${suffix}'
  location: location
  kind: 'functionapp,linux'
  identity: { type: 'SystemAssigned' }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}app-package'
          authentication: { type: 'SystemAssignedIdentity' }
        }
      }
      scaleAndConcurrency: { maximumInstanceCount: maxInstances, instanceMemoryMB: 2048 }
      runtime: { name: 'python', version: '3.11' }
    }
    siteConfig: {
      appSettings: concat(hostSettings, map(items(settings), s => { name: s.key, value: s.value }))
    }
  }
}

output principalId string = app.identity.principalId
output name string = app.name
output hostName string = app.properties.defaultHostName
